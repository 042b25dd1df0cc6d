"""Content-addressed blob store on a real directory."""

from __future__ import annotations

import gzip
import hashlib

import pytest

from memq.errors import NotFound, SnapshotError, StorageError
from memq.load import load_snapshot_file
from memq.store.blobs import BlobStore
from tests.helpers import REAL


def test_put_get_round_trip_is_idempotent_and_verified(tmp_path):
    loaded = load_snapshot_file(REAL / "frag_synthetic" / "oom.pickle.gz", keep_raw=True)
    blobs = BlobStore(tmp_path / "blobs")
    ref = blobs.put(loaded.sha256, loaded.raw)
    assert ref == f"{loaded.sha256[:2]}/{loaded.sha256}.zst"
    assert blobs.put(loaded.sha256, loaded.raw) == ref  # same bytes: nothing written twice
    assert blobs.get(loaded.sha256) == loaded.raw
    assert len(list((tmp_path / "blobs").rglob("*"))) == 2  # one directory, one file, no temp leftovers

    (tmp_path / "blobs" / ref).write_bytes(__import__("zstandard").ZstdCompressor().compress(b"tampered"))
    with pytest.raises(SnapshotError, match="corrupt"):
        blobs.get(loaded.sha256)


def test_refuses_wrong_hash_and_reports_missing(tmp_path):
    blobs = BlobStore(tmp_path)
    with pytest.raises(SnapshotError):
        blobs.put("0" * 64, b"not these bytes")
    with pytest.raises(SnapshotError):
        blobs.put("../../etc/passwd", b"x")
    with pytest.raises(NotFound, match="not in the blob store"):
        blobs.get("1" * 64)


def test_agent_encoded_bytes_are_kept_as_they_came(tmp_path):
    raw = (REAL / "frag_synthetic" / "fragmented.pickle.gz").read_bytes()
    plain = gzip.decompress(raw)
    sha = hashlib.sha256(plain).hexdigest()
    blobs = BlobStore(tmp_path)
    ref = blobs.put_encoded(sha, raw, "gzip")
    assert ref.endswith(".gz") and (tmp_path / ref).read_bytes() == raw
    assert blobs.get(sha) == plain
    with pytest.raises(SnapshotError):
        blobs.put_encoded("2" * 64, raw, "gzip")


def test_unwritable_directory_is_a_storage_error(tmp_path):
    (tmp_path / "file").write_text("x")
    blobs = BlobStore(tmp_path / "file" / "blobs")
    with pytest.raises(StorageError, match="MEMQ_BLOB_DIR"):
        blobs.put(hashlib.sha256(b"x").hexdigest(), b"x")
    with pytest.raises(StorageError):
        blobs.check_writable()
