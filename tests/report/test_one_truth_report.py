"""The nightly report on the real day-1 runs says one thing once (issue 42 items 1-3): the reason a
failing step's need is unknown once in the OOM table, and the same "free in pieces" as `memq analyze`."""

from __future__ import annotations

import re

from tests.report.conftest import DAY1
from tests.report.test_report_content import _by_run, _report

BASIS = "no complete earlier training step of this run was recorded"


def test_the_oom_table_says_the_unsettled_reason_once(history):
    doc = _report(history, DAY1)
    needs = [r["step_need"] or "" for r in doc["ooms"]["runs"]]
    assert sum(BASIS in n for n in needs) == 1, needs
    first = next(r["run"] for r in doc["ooms"]["runs"] if BASIS in (r["step_need"] or ""))
    assert sum(f"(as for {first})" in n for n in needs) >= 1, needs
    html = re.sub(r"\s+", " ", _report(history, DAY1, fmt="html"))
    table = html[html.index('id="oom-runs"'):]
    table = table[: table.index("</table>")]
    assert table.count(BASIS) == 1
    runs = _by_run(doc["ooms"]["runs"])
    assert not any(r["undetermined"] for r in runs.values())


def test_the_report_and_analyze_give_one_free_in_pieces(history):
    import json

    from click.testing import CliRunner

    from memq.cli import cli
    from memq.units import fmt_bytes
    from tests.helpers import run_files

    doc = _report(history, DAY1)
    frag = {r["run"]: r for r in doc["fragmented"]}["frag_dyn"] if isinstance(doc["fragmented"], list) else None
    if frag is None:
        frag = {r["run"]: r for r in doc["fragmented"]["runs"]}["frag_dyn"]
    res = CliRunner().invoke(cli, ["analyze", *map(str, run_files("frag_dynamic_1.15")), "--limit", "20244645632"])
    text = re.sub(r"\s+", " ", res.output)
    assert f"{fmt_bytes(frag['fragmented_free_bytes'], 'brief')} is in pieces" in text, (frag, text[:600])
    m = json.loads(CliRunner().invoke(cli, ["analyze", *map(str, run_files("frag_dynamic_1.15")), "--json"]).output)
    mm = m["metrics"]
    assert frag["fragmented_free_bytes"] == mm["reserved_unallocated_bytes"] - mm["largest_free_block_bytes"]


def test_the_report_says_pieces_as_the_runs_list_does(history):
    # the summary said "ratio 0.55" and the table a `fragmentation` column beside "free in pieces", where
    # `memq runs` shows the same run's pieces (share of reserved free in pieces at the OOM)
    import json

    from tests.report.conftest import invoke

    doc = _report(history, DAY1)
    runs = {r["run"]: r for r in json.loads(invoke(history.env, ["runs", "--json"]).output)["runs"]}
    top = doc["fragmented"][0]
    line = next(x for x in doc["summary"] if x.startswith("Most fragmented"))
    assert f"{runs[top['run']]['pieces_share']:.2f} of reserved" in line, (line, runs[top["run"]])
    assert "ratio" not in line
    html = re.sub(r"\s+", " ", _report(history, DAY1, fmt="html"))
    table = html[html.index('id="fragmented"'):]
    table = table[: table.index("</table>")]
    assert "<th>fragmentation</th>" not in table and ">pieces</th>" in table
    assert f">{runs[top['run']]['pieces_share']:.2f}<" in table
    md = _report(history, DAY1, fmt="md")
    assert "| cause | pieces | free in pieces |" in md and "| cause | fragmentation | free in pieces |" not in md
