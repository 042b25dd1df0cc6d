"""What a mature tool does not print (issue 42 item 10), on the real fixtures: counts with the right
plural, one label before the forecast, `--rows` for a row count (every other --limit is memory), a
whatif that reads the OOM message as analyze does and says sizes once, one-line answers on
`whatif --sweep` and `fit`, and a one-snapshot run's plot with one moment on its time axis."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from memq.cli import cli
from memq.render.words import labelled, noun, plural, said
from tests.helpers import REAL, meta


def memq(*args, code=0):
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    assert res.exit_code == code, f"memq {' '.join(map(str, args))} exited {res.exit_code}: {res.output}"
    return res


def test_plural_words_and_labels():
    assert plural(1, "snapshot") == "1 snapshot" and plural(2, "snapshot") == "2 snapshots"
    assert plural(1, "near miss") == "1 near miss" and plural(0, "near miss") == "0 near misses"
    assert noun(1, "run") == "run" and noun(3, "run") == "runs"
    assert said("external_memory") == "external memory" and said("not_assessable") == "not assessable"
    assert said(None) == "-" and said("some_new_cause") == "some new cause"
    assert labelled("forecast", "OOM forecast: not known yet (x)") == "forecast: not known yet (x)"
    assert labelled("forecast while it ran", "OOM forecast: not known yet") == "forecast while it ran: not known yet"
    assert labelled("forecast", "will run out of memory in epoch 7") == "forecast: will run out of memory in epoch 7"


def test_runs_counts_rows_with_rows_and_refuses_limit(memq_env):
    memq("db", "upgrade")
    memq("ingest", str(REAL / "capacity" / "oom.pickle.gz"), "--run", "cap", "--limit", "16GiB")
    memq("ingest", str(REAL / "external" / "oom.pickle.gz"), "--run", "ext", "--device-total", "150109880320")
    assert len(json.loads(memq("runs", "--rows", 1, "--json").output)["runs"]) == 1
    assert len(json.loads(memq("runs", "-n", 2, "--json").output)["runs"]) == 2
    res = memq("runs", "--limit", 5, code=2)
    assert "--rows 5" in res.output and "memory limit" in res.output
    assert re.search(r"^\s*1 run\s*$", memq("runs", "-n", 1).output, re.M)


def test_one_snapshot_plot_has_one_moment(memq_env, tmp_path):
    from memq.pipeline.report_source import SqlReportSource
    from memq.report.data import run_timeline
    from memq.report.plots import timeline_figure
    from memq.store.connection import open_store

    memq("db", "upgrade")
    memq("ingest", str(REAL / "capacity" / "oom.pickle.gz"), "--run", "cap", "--limit", "16GiB",
         "--oom-message", meta("capacity")["oom_message"])
    out = memq("plot", "--run", "cap", "--out", tmp_path / "cap.png").output
    assert "1 snapshot," in out and "1 snapshots" not in out
    store = open_store()
    try:
        with store.session() as s:
            fig = timeline_figure(run_timeline(SqlReportSource(s), "cap"))
    finally:
        store.close()
    ax = fig.axes[0]
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert len(labels) == 1 and re.fullmatch(r"\d\d:\d\d:\d\d", labels[0]), labels
    assert ax.get_xlim() == (-1.0, 1.0) and ax.xaxis.get_offset_text().get_text() == ""
    assert "one moment" in ax.get_xlabel()


def test_whatif_reads_the_oom_message_and_answers_in_one_line():
    oom = str(REAL / "frag_dynamic_1.15" / "oom.pickle.gz")
    msg = meta("frag_dynamic_1.15")["oom_message"]
    text = memq("whatif", oom, "--sweep", "--oom-message", msg).output
    lines = text.splitlines()
    assert lines[0].endswith("limit 18.85 GiB")  # the message's "18.85 GiB allowed", as analyze reads it
    assert lines[1].startswith("answer: ") and "OOM" in lines[1]
    docs = json.loads(memq("whatif", oom, "--oom-message", msg, "--json").output)
    assert abs(docs[0]["limit_bytes"] - 18.85 * 2**30) < 0.005 * 2**30
    bare = memq("whatif", oom).output
    assert not re.search(r"\d{7,} bytes", bare), bare  # sizes said once, in units
    assert "GiB (reserved bytes at the recorded OOM" in bare
    assert "--oom-message goes with snapshot files" in memq("whatif", "--run", "x", "--oom-message", msg, code=2).output


def test_whatif_answer_names_the_best_setting():
    from memq.cli.whatif import answer_line

    rows = [{"conf": "", "predicted_oom": True, "verdict": "oom"},
            {"conf": "max_split_size_mb:128", "predicted_oom": False, "verdict": "survives_window",
             "headroom_bytes": 3 * 2**30, "confidence": "medium"},
            {"conf": "expandable_segments:True", "predicted_oom": False, "verdict": "fits",
             "headroom_bytes": 2**30, "confidence": "high"}]
    assert answer_line(rows) == "answer: expandable_segments:True avoids the OOM, 1.00 GiB headroom (confidence high)"
    rows[2]["predicted_oom"], rows[2]["verdict"] = True, "oom"
    assert answer_line(rows).startswith("answer: max_split_size_mb:128 avoids the OOM over the recorded window")
    rows[1]["predicted_oom"], rows[1]["verdict"] = True, "oom"
    assert answer_line(rows) == "answer: no allocator setting tried avoids the OOM"
