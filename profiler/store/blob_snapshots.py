"""A stored blob back as a parsed snapshot: what the service, the sweeps, the what-if and fit sources
and the reports read. Beneath all of them (it needs only a store's blobs and settings), so none of them
imports another for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memq.load import LoadedSnapshot, decode_snapshot_bytes

if TYPE_CHECKING:
    from memq.store.connection import Store


def load_blob(store: Store, sha256: str, name: str | None = None) -> LoadedSnapshot:
    raw = store.blobs.get(sha256)
    return decode_snapshot_bytes(raw, store.settings.decode_max_bytes, name=name or sha256[:12])
