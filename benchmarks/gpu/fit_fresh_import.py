"""Turn a capture of fit_fresh.py into the fixture tests/fixtures/fit_fresh (no torch), as
fit_families_import.py turns fit_families.py's:

    python3 benchmarks/gpu/fit_fresh_import.py /path/to/fitfresh [--dest tests/fixtures/fit_fresh]
    python3 benchmarks/gpu/fit_fresh_import.py /path/to/fitfresh --merge /path/to/redo   (then import as above)

- summary.json, spools/FAMILY/defaults/..., hand/FAMILY.pickle.gz: as fit_families_import.py writes them;
- dumps/FAMILY-dump.{forward,backward}.pickle.gz: the step-1 dumps, unchanged (gzip; memq reads them as is).
Prints the bytes written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fit_families_import import import_capture  # noqa: E402
from job_process import settle  # noqa: E402

DEFAULT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "fit_fresh"


def import_fresh(src: Path, dest: Path) -> int:
    total = import_capture(src, dest)
    for fam in json.loads((src / "summary.json").read_text()).get("families", {}):
        for part in ("forward", "backward"):
            name = f"{fam}-dump.{part}.pickle.gz"
            got = src / "dumps" / name
            if got.is_file() and got.stat().st_size:
                (dest / "dumps").mkdir(parents=True, exist_ok=True)
                shutil.copyfile(got, dest / "dumps" / name)
                total += got.stat().st_size
    return total


def merge_redo(redo: Path, capture: Path) -> list[str]:
    """Fold what fit_fresh_redo.sh ran again (REDO/results/TAG.json, its rc per tag in REDO's log, REDO/dumps)
    into a capture: each TAG's run replaces the capture's, "crashed" where it did not exit 0. Returns the tags."""
    import re

    rcs = {}
    for log in redo.glob("*.txt"):
        for m in re.finditer(r"^\[([^\]]+)\] rc=(\d+)", log.read_text(), re.M):
            rcs[m.group(1)] = int(m.group(2))
    summary_path = capture / "summary.json"
    summary = json.loads(summary_path.read_text())
    done = []
    for res in sorted((redo / "results").glob("*.json")):
        tag = res.stem
        fam = next((f for f in summary["families"] if tag.startswith(f + "-b")), None)
        if fam is None:
            continue
        run = settle(json.loads(res.read_text()), rcs.get(tag, "unknown"))
        summary["families"][fam]["runs"][tag] = run
        done.append(f"{tag}: {run['outcome']} rc={run['rc']}")
    for got in (redo / "dumps").glob("*.pickle.gz"):
        (capture / "dumps").mkdir(exist_ok=True)
        shutil.copyfile(got, capture / "dumps" / got.name)
    summary_path.write_text(json.dumps(summary, indent=1))
    return done


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("--dest", type=Path, default=DEFAULT)
    ap.add_argument("--merge", type=Path, default=None, help="a fit_fresh_redo.sh output folder to fold into SRC")
    args = ap.parse_args()
    if args.merge is not None:
        print("\n".join(merge_redo(args.merge, args.src)))
        return
    print(f"{args.dest}: {import_fresh(args.src, args.dest) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
