"""Holds the sitecustomize.py that `memq run` puts on PYTHONPATH (a package only so that it ships)."""
