"""Turn a capture of fit_fresh.py into the fixture tests/fixtures/fit_fresh (no torch), as
fit_families_import.py turns fit_families.py's:

    python3 benchmarks/gpu/fit_fresh_import.py /path/to/fitfresh [--dest tests/fixtures/fit_fresh]

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("--dest", type=Path, default=DEFAULT)
    args = ap.parse_args()
    print(f"{args.dest}: {import_fresh(args.src, args.dest) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
