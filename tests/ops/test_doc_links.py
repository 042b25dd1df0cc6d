"""Every link in the README and the docs leads to a file of the repository (issue 42 item 6): a reader
of a clone or of the wheel's sources has nothing outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _docs() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.split() if not p.startswith("tests/")]


#: the design notes' folder beside a checkout, which a clone or a wheel does not have
SIBLING = "../" + "shared"


def outside_links(path: Path, root: Path = ROOT) -> list[str]:
    bad = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if SIBLING in line:
            bad.append(f"{path.relative_to(root)}:{n}: {SIBLING}")
        # a design note outside the repository, named in prose (the rules table's generated source
        # column says "ARCHITECTURE.md cause N", which docs/analysis.md maps onto docs/causes.md)
        if "ARCHITECTURE.md" in line and not line.startswith("|") and "cause N" not in line:
            bad.append(f"{path.relative_to(root)}:{n}: ARCHITECTURE.md")
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file = (path.parent / target.split("#")[0]).resolve()
            if not file.is_relative_to(root) or not file.exists():
                bad.append(f"{path.relative_to(root)}:{n}: {target}")
    return bad


def test_no_doc_links_outside_the_repository():
    docs = _docs()
    assert ROOT / "README.md" in docs and ROOT / "docs" / "causes.md" in docs and ROOT / "docs" / "contract.md" in docs
    assert [b for d in docs for b in outside_links(d)] == []


def test_the_check_sees_an_outside_link(tmp_path):
    """A probe checkout in tmp_path (nothing is written into the repository): a link to the sibling
    notes folder, the notes named in prose, and a link to a missing file are each seen."""
    root = tmp_path / "checkout"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "here.md").write_text("here\n")
    probe = root / "docs" / "probe.md"
    probe.write_text(f"see [the notes](../{SIBLING}/ARCHITECTURE.md) and [gone](missing.md), [ok](here.md)\n")
    assert len(outside_links(probe, root)) == 4
