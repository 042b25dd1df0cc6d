"""Issue 13 items 7 and 8: what memq writes is safe.

- `memq report --out` writes regular files only: /dev/full (run as root here, where the old atomic
  rename replaced the device with a file), a directory, a FIFO, a missing parent directory (never
  created), a place where files cannot be created -> one line, exit 2; the device is still a device.
- Names carrying terminal escapes (stored before names were validated, or written into Redis by any
  job) are printed by `memq runs`, `--csv`, `history` and `status` without a raw control byte:
  shown as visible escapes (CSV: escaped, not stripped); `--json` keeps the exact name.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memq.render.safe import safe_text
from tests.bombs import REAL, clean_env

EVIL = "evil\x1b]0;TITLE\x07\x9b31m\r[/bold]\u202eend"
RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\r", "\x00", "\u202e")


def _memq(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memq", *args], env=env, capture_output=True, timeout=timeout,
                          cwd=Path(__file__).resolve().parents[2])


@pytest.fixture
def env(tmp_path) -> dict:
    return clean_env(MEMQ_DATABASE_URL=f"sqlite:///{tmp_path / 'h.db'}", MEMQ_DATA_DIR=str(tmp_path / "data"),
                     MEMQ_BLOB_DIR=str(tmp_path / "blobs"), MEMQ_CONFIG=str(tmp_path / "none.toml"),
                     MEMQ_REPORT_DIR=str(tmp_path / "reports"))


def _refused(p: subprocess.CompletedProcess) -> str:
    err = p.stderr.decode()
    assert p.returncode == 2, (p.returncode, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memq: error: "), err
    assert "internal error" not in err and "Traceback" not in err
    return lines[0]


# ------------------------------------------------------------------------------ report --out (item 7)


def test_report_out_refuses_dev_full_and_leaves_the_device(env):
    before = os.stat("/dev/full")
    assert stat.S_ISCHR(before.st_mode)
    line = _refused(_memq(env, "report", "--format", "html", "--out", "/dev/full", "--no-store"))
    assert "/dev/full is a character device" in line
    after = os.stat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


def test_report_out_refuses_a_directory_a_fifo_and_a_missing_parent(env, tmp_path):
    assert "is a directory" in _refused(_memq(env, "report", "--format", "json", "--out", str(tmp_path)))
    fifo = tmp_path / "r.fifo"
    os.mkfifo(fifo)
    assert "is a FIFO" in _refused(_memq(env, "report", "--format", "json", "--out", str(fifo), timeout=60))
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    missing = tmp_path / "missing" / "dir" / "r.html"
    line = _refused(_memq(env, "report", "--out", str(missing)))
    assert "does not exist" in line and not (tmp_path / "missing").exists()
    line = _refused(_memq(env, "report", "--format", "md", "--out", "/proc/memq-report.md", "--no-store"))
    assert "cannot write /proc/memq-report.md" in line


def test_plot_out_has_the_same_rule(env, tmp_path):
    line = _refused(_memq(env, "plot", "--run", "x", "--out", str(tmp_path / "nope" / "x.png")))
    assert "does not exist" in line and not (tmp_path / "nope").exists()


def test_report_out_writes_regular_files_atomically(env, tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    p = _memq(env, "report", "--format", "json", "--out", str(link), "--no-store")
    assert p.returncode == 0, p.stderr.decode()
    assert link.is_symlink() and "date" in json.loads(target.read_text())  # written through the link
    assert not [x for x in tmp_path.iterdir() if x.name.endswith(".tmp")]


# ------------------------------------------------------------------------------ escapes (item 8)


def _no_raw_controls(text: str) -> None:
    found = [repr(c) for c in RAW_CONTROLS if c in text]
    assert not found, f"raw control characters {found} in output"


def test_runs_csv_and_history_escape_a_stored_name(env):
    gz = REAL / "frag_synthetic" / "oom.pickle.gz"
    assert _memq(env, "ingest", str(gz), "--run", "plain", "--json").returncode == 0
    # a run stored before names were validated (or by an older version): rename it in SQL
    import sqlite3

    db = env["MEMQ_DATABASE_URL"].removeprefix("sqlite:///")
    with sqlite3.connect(db) as c:
        assert c.execute("UPDATE runs SET name = ?, job = ? WHERE name = 'plain'", (EVIL, EVIL + "\x00")).rowcount == 1

    table = _memq(env, "runs")
    assert table.returncode == 0, table.stderr.decode()
    out = table.stdout.decode()
    _no_raw_controls(out)
    # the run cell may wrap over two lines (how wide it is depends on the other columns): join its pieces
    run_cell = "".join(line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│"))
    assert safe_text(EVIL) in run_cell, out

    raw_csv = _memq(env, "runs", "--csv")
    assert raw_csv.returncode == 0
    out = raw_csv.stdout.decode()
    _no_raw_controls(out)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[0]["run"] == safe_text(EVIL) and rows[0]["job"] == safe_text(EVIL + "\x00")

    as_json = json.loads(_memq(env, "runs", "--json").stdout)
    assert as_json["runs"][0]["run"] == EVIL  # JSON keeps the exact name (control characters as \u escapes)

    hist = _memq(env, "history", "--run", EVIL)
    assert hist.returncode == 0, hist.stderr.decode()
    _no_raw_controls(hist.stdout.decode())
    assert "[/bold]" in hist.stdout.decode()  # shown as text, not read as rich markup


def test_error_lines_escape_names(env):
    p = _memq(env, "history", "--run", EVIL)
    assert p.returncode == 4
    _no_raw_controls(p.stderr.decode())


@pytest.mark.redis
def test_status_escapes_what_jobs_wrote_into_redis(env, tmp_path):
    from tests.workers.stack import PrivateRedis

    srv = PrivateRedis(tmp_path / "redis").start()
    try:
        import redis

        r = redis.Redis.from_url(srv.url)
        r.xadd("memq:dead", {"run": EVIL, "kind": "snapshot\x1b[2J", "reason": f"bad blob {EVIL}", "stage": "dispatch"})
        r.set("memq:heartbeat:worker:x", json.dumps({"kind": "worker", "name": EVIL, "pid": 1, "host": EVIL,
                                                     "last": time.time(), "queues": [EVIL]}))
        p = _memq(dict(env, MEMQ_REDIS_URL=srv.url), "status", "--no-db")
        assert p.returncode == 0, p.stderr.decode()
        out = p.stdout.decode()
        _no_raw_controls(out)
        assert "\\x1b]0;TITLE\\x07" in out and "[/bold]" in out
    finally:
        srv.kill()


def test_safe_text_escapes_every_kind_of_control():
    assert safe_text("a\x1b]0;T\x07b") == "a\\x1b]0;T\\x07b"
    assert safe_text("\x00\r\n\t\x7f\x85\x9b") == "\\x00\\r\\n\\t\\x7f\\x85\\x9b"
    assert safe_text("x\u202ey\u2066z\u2028") == "x\\u202ey\\u2066z\\u2028"
    assert safe_text("line1\nline2\r", keep_newlines=True) == "line1\nline2\\r"
    assert safe_text("résumé 模型 🚀 [bold]") == "résumé 模型 🚀 [bold]"  # printable text is left alone


def test_analyze_report_escapes_frames_from_the_snapshot(env, tmp_path):
    """Frames are text from a foreign process: function names carrying escapes (and rich markup)
    are shown escaped in the terminal report of `memq analyze`."""
    import pickle

    from memq import codec

    snap = codec.loads_restricted(codec.decompress((REAL / "seed_adamw" / "epoch0.pickle.gz").read_bytes()))
    frames = [f for seg in snap["segments"] for b in seg["blocks"] for f in b.get("frames") or []]
    frames += [f for tr in snap.get("device_traces") or [] for e in tr for f in e.get("frames") or []]
    for f in {id(f): f for f in frames}.values():  # each frame once (the pickle may share them)
        f["name"] = "fn\x1b]0;TITLE\x07[/bold]" + str(f.get("name"))
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))  # our own data, pickled here
    p = _memq(env, "analyze", str(path))
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    _no_raw_controls(out)
    assert "fn\\x1b]0;TITLE\\x07[/bold]" in out


def test_ingest_summary_escapes_frames_and_keeps_its_own_markup(env, tmp_path):
    """`memq ingest`'s run diagnosis panel names the leak's allocation sites (frames from the snapshot):
    a frame name that is rich markup (a closing tag, a link) is shown as written, never interpreted,
    and the panel's own bold cause still renders as bold, not as a literal `[bold]` (an unescaped name
    made the whole panel fall back to plain text); advice with no effect to state prints no lone '-'."""
    import pickle

    from memq import codec

    leak = REAL.parent / "captured" / "leak_epochs"
    names = ["epoch0", "epoch1", "epoch2", "epoch3", "epoch4", "oom"]
    paths = []
    for stem in names:
        snap = codec.loads_restricted(codec.decompress((leak / f"{stem}.pickle.gz").read_bytes()))
        frames = [f for seg in snap["segments"] for b in seg["blocks"] for f in b.get("frames") or []]
        frames += [f for tr in snap.get("device_traces") or [] for e in tr for f in e.get("frames") or []]
        # each frame once: the pickle shares one dict per distinct frame among the lists that hold it,
        # so prefixing per occurrence grew names to 127 KB (a test of escaping, not of long names)
        for f in {id(f): f for f in frames}.values():
            f["name"] = "[/bold]fn[link=http://evil.test]" + str(f.get("name"))
        paths.append(tmp_path / f"{stem}.pickle")
        paths[-1].write_bytes(pickle.dumps(snap, protocol=4))  # our own data, pickled here
    p = _memq({**env, "FORCE_COLOR": "1", "TERM": "xterm-256color"}, "ingest", *map(str, paths),
              "--run", "evil-frames", "--limit", "7516192768")
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    assert "[/bold]fn[link=http://evil.test]" in out  # the name as written
    assert "\x1b]8;" not in out  # no hyperlink escape: the name was not read as markup
    assert "[bold]" not in out
    assert "\x1b[1mleak\x1b[0m" in out  # the panel's own markup rendered (bold)
    assert "kept-tensors" in out


def test_advice_with_no_effect_prints_no_lone_dash(env):
    p = _memq(env, "ingest", str(REAL / "seed_sgd" / "epoch0.pickle.gz"), "--run", "quiet")
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode()
    assert "-> No change needed" in out and "No change needed: -" not in out
    p = _memq(env, "analyze", str(REAL / "seed_sgd" / "epoch0.pickle.gz"))
    assert "No change needed" in p.stdout.decode() and "effect: -" not in p.stdout.decode()
