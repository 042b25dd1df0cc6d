"""One exception root for memq. Each subclass carries the process exit code the CLI uses.

Exit codes are mapped here and nowhere else:
    0  success
    1  internal or service error (database, Redis unreachable, ...)
    2  bad input (unreadable, refused, too large snapshot; bad option value)
    3  schema out of date (run `memq db upgrade`)
    4  not found (unknown run, snapshot)
Exceptions stay pickle-safe (plain args) because Celery ships them between processes.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_SCHEMA = 3
EXIT_NOT_FOUND = 4


class MemqError(Exception):
    """Root of every error memq raises on purpose. `str(err)` is a one-line user message."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message, hint)
        self.message = message
        self.hint = hint

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.hint))

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


def _rebuild(cls, message, hint):
    return cls(message, hint=hint)


class BadInput(MemqError):
    """Input the user gave cannot be used: a snapshot, an option value, a message."""

    exit_code = EXIT_BAD_INPUT


class SnapshotError(BadInput):
    """A snapshot file or blob cannot be decoded or has the wrong shape."""


class RefusedPickle(SnapshotError):
    """The pickle asks for a global (a class or a function): never executed."""


class TooLarge(SnapshotError):
    """The input exceeds a configured size limit."""


class NestedTooDeep(SnapshotError):
    """The input nests containers deeper than any snapshot does (refused before anything recurses)."""


class DecodeUnavailable(MemqError):
    """The decoder cannot run now (no thread or address space left in this process): nothing is known
    about the input, and retrying later may succeed. Never cached or recorded as the input's fault."""


class NotRegularFile(BadInput):
    """A path names a device, FIFO, socket or directory where memq reads or writes regular files only."""


class OutputError(BadInput):
    """An output path given by the user cannot be written (missing directory, read-only, disk full)."""


class ConfigError(BadInput):
    """A setting in the environment or the config file is invalid."""


class NotFound(MemqError):
    exit_code = EXIT_NOT_FOUND


class StorageError(MemqError):
    """The database refused an operation for a reason retrying will not fix."""


class StorageUnavailable(StorageError):
    """The database cannot be reached now; retrying later may succeed."""


class SchemaOutOfDate(StorageError):
    exit_code = EXIT_SCHEMA


class BrokerUnavailable(MemqError):
    """Redis cannot be reached now; retrying later may succeed."""
