"""Every recommendation names its OOM-playbook entry (profiler/playbook.py) and every human rendering
shows the link `docs/playbook.md#<id>`: on all real fixture snapshots (tests/fixtures/captured and
tests/fixtures/real) alone, with their limits, and as the runs they were recorded in; the terminal
report, the nightly report (HTML and Markdown) and the web page of a stored history. Results stored
before recommendations carried an id still render, without a link."""

from __future__ import annotations

import copy
import io
import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from memq.analysis import CAUSES, analyze, message_facts
from memq.analysis.ranks import _advice
from memq.analysis.recommend import recommend
from memq.load import load_snapshot_file
from memq.model import OomContext
from memq.oom_message import parse_oom_message
from memq.playbook import BY_ID
from tests.analysis.test_captured_labels import CAPTURED, CASES
from tests.analysis.test_ranks import CAP, _facts
from tests.conftest import memq_environ
from tests.helpers import REAL, REAL_RUNS, meta, run_files

FILES = sorted(CAPTURED.rglob("*.pickle.gz")) + sorted(REAL.rglob("*.pickle.gz"))


def _limit_of(path: Path) -> OomContext | None:
    """The context the fixture was recorded under (its folder's cap or device total), when known."""
    for folder, (_, cap) in CASES.items():
        if path.parent == CAPTURED / folder and cap:
            return OomContext(limit_bytes=cap)
    for folder, (_, opts) in REAL_RUNS.items():
        if path.parent == REAL / folder and opts:
            return OomContext(limit_bytes=opts.get("limit"), device_total_bytes=opts.get("device_total"))
    return None


@pytest.fixture(scope="module")
def results() -> list[tuple[str, dict]]:
    """(what was analysed, the result): each snapshot alone without and with its context, each recorded
    run as a run, and the runs whose meta.json keeps the OOM message with that message."""
    out = []
    for f in FILES:
        snap = load_snapshot_file(f)
        out.append((f"{f} alone", analyze([snap], None, names=[str(f)])))
        ctx = _limit_of(f)
        if ctx is not None:
            out.append((f"{f} with its limit", analyze([snap], ctx, names=[str(f)])))
    for folder, (stems, cap) in CASES.items():
        snaps = [load_snapshot_file(CAPTURED / folder / f"{s}.pickle.gz") for s in stems]
        out.append((f"captured run {folder}", analyze(snaps, OomContext(limit_bytes=cap))))
        msg = json.loads((CAPTURED / folder / "meta.json").read_text()).get("oom_message")
        if msg:
            out.append((f"captured run {folder} + message",
                        analyze(snaps, OomContext(message=parse_oom_message(msg)))))
    for folder, (_, opts) in REAL_RUNS.items():
        ctx = OomContext(limit_bytes=opts.get("limit"), device_total_bytes=opts.get("device_total"))
        snaps = [load_snapshot_file(p) for p in run_files(folder)]
        out.append((f"real run {folder}", analyze(snaps, ctx)))
        for opt in ("AdamW", "SGD"):
            out.append((f"real run {folder} ({opt})", analyze(snaps, ctx, optimizer=opt)))
    return out


def test_every_recommendation_of_every_fixture_names_a_known_entry(results):
    assert len(FILES) >= 70  # every fixture snapshot, not a sample
    seen = set()
    for what, r in results:
        recs = r["diagnosis"]["recommendations"]
        assert recs, what
        for rec in recs:
            assert {"action", "why", "expected_effect", "playbook"} <= rec.keys(), (what, rec)
            if rec["action"] == "No change needed":  # advises nothing: no entry to link
                assert rec["playbook"] is None, (what, rec)
                continue
            assert rec["playbook"] in BY_ID, (what, rec)
            seen.add(rec["playbook"])
    # The fixtures reach most of the advice memq gives, so the check above covers real choices.
    assert {"external-memory", "kept-tensors", "empty-cache", "expandable-segments", "max-split-size",
            "allocator-settings", "roundup-power2", "workspace", "activation-checkpointing"} <= seen, seen


def test_the_first_entry_follows_the_cause(results):
    """The entry is the one the cause's own advice is measured in, not a generic link."""
    first = {"external_memory": {"external-memory"}, "leak": {"kept-tensors"}, "workspace": {"workspace"},
             "allocator_config": {"roundup-power2", "max-split-size", "allocator-settings"},
             "fragmentation": {"expandable-segments", "allocator-settings"},
             "capacity": {"activation-checkpointing", "optimizer-state", "allocator-settings"},
             "optimizer_state": {"optimizer-state"}, "activation_spike": {"activation-checkpointing"},
             "healthy": {"activation-checkpointing", None}}  # None: "No change needed" advises nothing
    causes = set()
    for what, r in results:
        d = r["diagnosis"]
        causes.add(d["primary_cause"])
        assert d["recommendations"][0]["playbook"] in first[d["primary_cause"]], (what, d["recommendations"][0])
    assert {"external_memory", "leak", "workspace", "allocator_config", "fragmentation", "capacity",
            "healthy"} <= causes, causes
    roundup = next(r for w, r in results if w == "captured run dynamic_settings/roundup_4")
    assert roundup["diagnosis"]["recommendations"][0]["playbook"] == "roundup-power2"


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_every_branch_of_the_advice_names_an_entry(cause):
    """recommend() for every cause, on the facts of real OOM messages (a cause the fixtures never
    produce as primary, such as activation_spike, still has its advice checked)."""
    for folder in ("capacity", "external", "frag_synthetic", "frag_dynamic_1.15"):
        facts = message_facts(OomContext(message=parse_oom_message(meta(folder)["oom_message"])))
        for opt in (None, "AdamW", "SGD"):
            recs = recommend(cause, facts, opt, facts.leak)
            assert recs or cause not in ("external_memory", "leak", "optimizer_state", "workspace"), (cause, folder)
            for rec in recs:
                assert rec["playbook"] in BY_ID or (rec["playbook"] is None and rec["action"] == "No change needed"), \
                    (cause, folder, rec)


def test_rank_advice_names_rank_imbalance():
    healthy0 = _facts(REAL / "seed_adamw" / "epoch1.pickle.gz", 0)
    capacity1 = _facts(REAL / "capacity" / "oom.pickle.gz", 1, oom_at=1000.0, limit=CAP, requested=150994944)
    for kind in ("data", "state", "leak", "none"):
        recs = _advice(kind, capacity1, [healthy0])
        assert recs and all(r["playbook"] == "rank-imbalance" for r in recs), kind


def _terminal(result: dict) -> str:
    from memq.render.terminal import render_analysis

    buf = io.StringIO()
    render_analysis(result, buf, width=400)
    return buf.getvalue()


def _strip_playbook(doc):
    """A result as stored before recommendations carried a playbook id."""
    if isinstance(doc, dict):
        return {k: _strip_playbook(v) for k, v in doc.items() if k not in ("playbook", "recommendation_playbook")}
    if isinstance(doc, list):
        return [_strip_playbook(x) for x in doc]
    return doc


def test_terminal_report_shows_each_recommendations_link(results):
    for what, r in results[:40] + [x for x in results if x[0].startswith(("captured run", "real run"))]:
        text = _terminal(r)
        for rec in r["diagnosis"]["recommendations"]:
            if rec["playbook"] is None:  # "No change needed": no link printed
                assert "playbook: docs/playbook.md#None" not in text
                continue
            assert f"playbook: docs/playbook.md#{rec['playbook']}" in text, (what, rec)
    old = _terminal(_strip_playbook(copy.deepcopy(results[0][1])))
    assert "Recommendations" in old and "playbook:" not in old


# ------------------------------------------------------------------ stored history: report and web


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> dict:
    """Three real OOM runs ingested into SQLite (capacity, fragmentation, external memory)."""
    root = tmp_path_factory.mktemp("playbook_history")
    env = memq_environ(f"sqlite:///{root / 'memq.db'}", root) | {"MEMQ_REPORT_DIR": str(root / "reports")}
    runs = [
        [str(REAL / "capacity" / "oom.pickle.gz"), "--run", "capacity", "--job", "gpt", "--cluster", "b",
         "--limit", "17179869184", "--oom-message", meta("capacity")["oom_message"]],
        [str(REAL / "frag_synthetic" / "fragmented.pickle.gz"), str(REAL / "frag_synthetic" / "oom.pickle.gz"),
         "--run", "frag_synthetic", "--job", "synth", "--cluster", "b", "--limit", "8589934592"],
        [str(REAL / "external" / "oom.pickle.gz"), "--run", "external", "--job", "ext", "--cluster", "a",
         "--device-total", "150109880320"],
    ]
    for args in runs:
        res = _cli(env, "ingest", *args, "--json")
        assert res.exit_code == 0, res.output
    return {"env": env, "root": root}


def _cli(env: dict, *args: str):
    from memq.cli import cli

    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def _report(env: dict, root: Path, fmt: str) -> str:
    out = root / f"report.{fmt}"
    res = _cli(env, "report", "--date", "2026-11-29", "--format", fmt, "--out", str(out), "--no-store")
    assert res.exit_code == 0, res.output
    return out.read_text()


def test_report_html_and_markdown_link_the_entries(stored):
    html = _report(stored["env"], stored["root"], "html")
    # the OOM runs' first recommendation, and the setting that would help the fragmented run
    for entry in ("activation-checkpointing", "external-memory", "expandable-segments"):
        assert f"playbook: <code>docs/playbook.md#{entry}</code>" in html, entry
    md = _report(stored["env"], stored["root"], "md")
    assert "(playbook: docs/playbook.md#external-memory)" in md
    assert "(playbook: docs/playbook.md#expandable-segments)" in md


def test_history_and_web_page_link_the_entries(stored):
    res = _cli(stored["env"], "history", "--run", "external")
    assert res.exit_code == 0, res.output
    assert "playbook: docs/playbook.md#external-memory" in res.output

    from memq.web.render import render_page

    doc = json.loads(_cli(stored["env"], "history", "--run", "frag_synthetic", "--json").output)
    page = render_page("run.html", data=None, doc=doc, lanes={}, title="t")
    assert '<a href="/playbook#expandable-segments">docs/playbook.md#expandable-segments</a>' in page
    assert '<a href="/playbook#empty-cache">' in page
    offline = render_page("run.html", data=None, doc=doc, lanes={}, title="t", inline=True)
    assert "<code>docs/playbook.md#expandable-segments</code>" in offline and 'href="/playbook#' not in offline
    old = render_page("run.html", data=None, doc=_strip_playbook(doc), lanes={}, title="t")
    assert "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in old and "/playbook#" not in old


def test_results_stored_without_the_key_still_render(stored, tmp_path):
    """Analyses stored before recommendations named an entry (JSON in SQL) render with no link."""
    db = tmp_path / "old.db"
    with sqlite3.connect(stored["root"] / "memq.db") as a, sqlite3.connect(db) as b:
        a.backup(b)
    with sqlite3.connect(db) as c:
        for table, key in (("analysis_results", "id"), ("run_diagnoses", "run_id, rank")):
            for row in c.execute(f"SELECT {key}, result FROM {table}").fetchall():  # noqa: S608 - fixed names
                *ids, result = row
                where = " AND ".join(f"{k.strip()} = ?" for k in key.split(","))
                c.execute(f"UPDATE {table} SET result = ? WHERE {where}",  # noqa: S608
                          (json.dumps(_strip_playbook(json.loads(result))), *ids))
        assert "playbook" not in json.dumps(c.execute("SELECT result FROM run_diagnoses").fetchall())
    env = stored["env"] | memq_environ(f"sqlite:///{db}", tmp_path) | {
        "MEMQ_REPORT_DIR": str(tmp_path / "reports"), "MEMQ_BLOB_DIR": stored["env"]["MEMQ_BLOB_DIR"]}
    res = _cli(env, "history", "--run", "external")
    assert res.exit_code == 0 and "Find and stop what else holds the GPU" in res.output
    assert "playbook:" not in res.output
    html = _report(env, tmp_path, "html")
    assert "nvidia-smi" in html and "docs/playbook.md#external-memory" not in html
    # the fragmented run's setting comes from the stored diagnosis: no id there, so no link
    assert "expandable_segments:True" in html and "docs/playbook.md#expandable-segments" not in html


def test_alerts_carry_the_first_recommendations_entry(results):
    from memq.alerts.payload import alertmanager, slack
    from memq.alerts.verdict import RunFacts, Verdict, alert_body

    r = next(r for w, r in results if w == "real run external")
    f = RunFacts(run_id=1, name="ext", cluster="a", job="j", status="oom", primary_cause="external_memory",
                 oom_count=1, peak_reserved_bytes=r["metrics"]["reserved_bytes"], limit_bytes=None)
    v = Verdict("oom:external_memory", "oom", "external_memory")
    body = alert_body(f, v, r, "https://memq.example/ui/", 5.0)
    assert body["playbook"] == "https://memq.example/ui/playbook#external-memory"
    assert "playbook: https://memq.example/ui/playbook#external-memory" in slack(body)["text"]
    assert alertmanager(body, "k" * 40, "t")["commonAnnotations"]["playbook"] == body["playbook"]
    assert alert_body(f, v, r, "", 5.0)["playbook"] == "docs/playbook.md#external-memory"
    old = alert_body(f, v, _strip_playbook(copy.deepcopy(r)), "https://memq.example/ui", 5.0)
    assert old["playbook"] is None and "playbook" not in slack(old)["text"]
