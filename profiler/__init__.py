"""memq: evidence from the CUDA caching allocator for PyTorch out-of-memory failures.

Importing this package imports nothing heavy: not torch, sqlalchemy, celery or redis.
`from memq import agent` loads the in-job agent, which imports torch only when it starts.
"""

__version__ = "0.1.0"
