"""`memq playbook [ENTRY_ID]` (the entries; one entry's section of the packaged playbook; errors) and the
playbook entries `memq explain` names for the OOM messages kept with the real fixtures, plus the link
in `memq view`'s offline page.

The real playbook (profiler/playbook.md) is written by benchmarks/playbook.py from GPU runs; these
tests give the reader a placeholder of the same shape in a temporary directory (`--file`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from memq.cli import cli
from memq.playbook import BY_ID, ENTRIES
from tests.helpers import FIXTURES, REAL, meta

ROOT = Path(__file__).resolve().parents[2]

PLACEHOLDER = """# OOM playbook

Figures from GPU runs. <script>alert(1)</script>

## <a id="empty-cache"></a>torch.cuda.empty_cache()

empty_cache() returned 0 bytes that the OOM needed.

```text
## not a heading: a line inside a code block
```

## <a id="allocator-settings"></a>Allocator settings at the same cap

Settings compared at one cap.

### <a id="expandable-segments"></a>expandable_segments:True

The dynamic-shape job completed.

### <a id="max-split-size"></a>max_split_size_mb

Oversize blocks cost memory.

## <a id="kept-tensors"></a>A leak through kept tensors

Live bytes at epoch ends grew.
"""


def memq(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def memq_process(*args: str) -> subprocess.CompletedProcess:
    """The console script's way (errors mapped to exit codes by memq.cli.main)."""
    return subprocess.run([sys.executable, "-m", "memq", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def playbook_file(tmp_path) -> Path:
    p = tmp_path / "playbook.md"
    p.write_text(PLACEHOLDER)
    return p


def test_lists_every_entry_with_title_and_summary():
    res = memq("playbook")
    assert res.exit_code == 0, res.output
    for e in ENTRIES:
        assert e.id in res.output and e.title in res.output and e.summary in res.output
    doc = json.loads(memq("playbook", "--json").output)
    assert [e["id"] for e in doc["entries"]] == [e.id for e in ENTRIES]
    assert doc["entries"][0]["link"] == f"docs/playbook.md#{ENTRIES[0].id}"


def test_prints_an_entry_up_to_the_next_section_of_its_level(playbook_file):
    out = memq("playbook", "allocator-settings", "--file", str(playbook_file)).output
    assert out.startswith("## Allocator settings at the same cap")  # the anchor is for links, not the terminal
    # its own sub-sections are part of it; the next section of its level is not
    assert "expandable_segments:True" in out and "Oversize blocks cost memory." in out
    assert "kept tensors" not in out and "empty_cache()" not in out

    sub = memq("playbook", "expandable-segments", "--file", str(playbook_file)).output
    assert sub.startswith("### ") and "The dynamic-shape job completed." in sub and "max_split_size_mb" not in sub

    # a heading-like line inside a code block does not end the section
    first = memq("playbook", "empty-cache", "--file", str(playbook_file)).output
    assert "## not a heading" in first and "Allocator settings" not in first

    doc = json.loads(memq("playbook", "kept-tensors", "--json", "--file", str(playbook_file)).output)
    assert doc["id"] == "kept-tensors" and doc["markdown"].rstrip().endswith("Live bytes at epoch ends grew.")


def test_unknown_entry_exits_2_with_the_list_of_ids(playbook_file):
    p = memq_process("playbook", "no-such-entry", "--file", str(playbook_file))
    assert p.returncode == 2, p.stderr
    assert "no-such-entry" in p.stderr and all(e.id in p.stderr for e in ENTRIES)
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_missing_playbook_text_says_how_to_regenerate(tmp_path):
    p = memq_process("playbook", "empty-cache", "--file", str(tmp_path / "playbook.md"))
    assert p.returncode == 1 and "python benchmarks/playbook.py" in p.stderr and "Traceback" not in p.stderr
    # an entry the installed text does not hold yet: an older playbook, regenerate it
    old = tmp_path / "old.md"
    old.write_text(PLACEHOLDER)
    p = memq_process("playbook", "workspace", "--file", str(old))
    assert p.returncode == 1 and "has no section 'workspace'" in p.stderr
    assert "python benchmarks/playbook.py" in p.stderr


# ----------------------------------------------------------------------------- memq explain


def _fixture_messages() -> dict[str, str]:
    """Every OOM message kept with the fixtures (meta.json `oom_message`), and the agent-defaults
    scenarios' stderr tails, which carry the traceback above the message."""
    out = {}
    for m in sorted(FIXTURES.rglob("meta.json")):
        d = json.loads(m.read_text())
        if d.get("oom_message"):
            out[str(m.parent.relative_to(FIXTURES))] = d["oom_message"]
        for name, sc in (d.get("scenarios") or {}).items():
            tail = sc.get("stderr_tail") or ""
            if "out of memory" in tail.lower():
                out[f"agent_defaults/{name}"] = tail
    return out


MESSAGES = _fixture_messages()


def explain(text: str) -> dict:
    res = memq("explain", text, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_explain_names_the_entries_that_apply(name):
    doc = explain(MESSAGES[name])
    entries = doc["playbook"]
    assert entries, name
    for e in entries:
        assert e["id"] in BY_ID and e["title"] == BY_ID[e["id"]].title and e["why"], e
    for rec in doc["diagnosis"]["recommendations"]:
        assert rec["playbook"] in BY_ID
    text = memq("explain", MESSAGES[name]).output
    linked = {rec["playbook"] for rec in doc["diagnosis"]["recommendations"]}
    # the section lists the entries no recommendation links (said once)
    assert ("Playbook (also relevant)" in text) == any(e["id"] not in linked for e in entries)
    for e in entries:
        assert f"docs/playbook.md#{e['id']}" in text


def _by_id(doc: dict) -> dict[str, dict]:
    return {e["id"]: e for e in doc["playbook"]}


def test_explain_reads_the_figures_of_each_message():
    assert len(MESSAGES) >= 10
    # 4.60 GiB reserved but unallocated, and live + request fits the 18.85 GiB cap: the cache is in pieces
    frag = _by_id(explain(meta("frag_dynamic_1.15")["oom_message"]))
    assert frag["allocator-settings"]["helps"] and frag["expandable-segments"]["helps"]
    assert not frag["empty-cache"]["helps"] and "cannot help" in frag["empty-cache"]["why"]
    assert "4.60 GiB" in frag["allocator-settings"]["why"]
    # 19 MiB unallocated, 15.94 GiB live + 144 MiB over the 16 GiB cap: no setting helps, the step must shrink
    cap = _by_id(explain(meta("capacity")["oom_message"]))
    assert not cap["allocator-settings"]["helps"] and cap["activation-checkpointing"]["helps"]
    assert "expandable-segments" not in cap
    # 126 GiB of the card used outside PyTorch
    ext = explain(meta("external")["oom_message"])["playbook"]
    assert ext[0]["id"] == "external-memory" and "125.97 GiB" in ext[0]["why"]
    assert "activation-checkpointing" not in _by_id({"playbook": ext})
    # the traceback above the message fails in the optimizer's first step
    opt = _by_id(explain(MESSAGES["agent_defaults/optstep"]))
    assert "optimizer-state" in opt and "optimizer-state" not in _by_id(explain(meta("capacity")["oom_message"]))
    # over the cap in the loss of the forward pass: activations, not optimizer state
    big = _by_id(explain(MESSAGES["agent_defaults/oversized"]))
    assert big["activation-checkpointing"]["helps"] and "optimizer-state" not in big


def test_view_page_shows_the_links_as_text(tmp_path):
    out = tmp_path / "view.html"
    res = memq("view", str(REAL / "frag_synthetic" / "oom.pickle.gz"), "--limit", "8589934592", "--out", str(out))
    assert res.exit_code == 0, res.output
    html = out.read_text()
    # an offline file: no /playbook page to link to, so the entry is named as text
    assert "<code>docs/playbook.md#expandable-segments</code>" in html
    assert "<code>docs/playbook.md#empty-cache</code>" in html and 'href="/playbook#' not in html


def test_the_playbook_speaks_of_the_product_not_of_its_capture():
    """Issue 23 item 10: the page showed a literal HTML comment and the capture's scratch folders and
    tooling; `memq playbook ID` printed raw `<a id>` tags."""
    from memq.playbook_doc import read_playbook, to_html

    text = read_playbook()
    for bad in ("<!--", "/tmp", "device tool", "workplace", "PYTHONPATH="):
        assert bad not in text, bad
    assert "&lt;!--" not in to_html(text)
    for e in ENTRIES:
        res = memq("playbook", e.id)
        assert res.exit_code == 0 and "<a id" not in res.output and res.output.startswith("#")
