"""Turn a capture of fit_families.py into the test fixture tests/fixtures/fit_families (no torch):

    python3 benchmarks/gpu/fit_families_import.py /path/to/fitfam [--dest tests/fixtures/fit_families]

- summary.json: the capture's summary (split, per family its spec, every run's result, the cap), with
  the per-job output tails dropped;
- spools/FAMILY/defaults/...: the agent's spool at its defaults, unchanged;
- hand/FAMILY.pickle.gz: the hand-recorded snapshot (gzip; memq reads it as is).
Prints the bytes written, so a fixture too large to keep is seen before it is committed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path


def import_capture(src: Path, dest: Path) -> int:
    """The fixture written from the capture in src; the bytes written."""
    summary = json.loads((src / "summary.json").read_text())
    for doc in summary.get("families", {}).values():
        for run in doc.get("runs", {}).values():
            run.pop("tail", None)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    total = (dest / "summary.json").stat().st_size
    for fam in summary.get("families", {}):
        spool = src / "spools" / fam / "defaults"
        if spool.is_dir():
            out = dest / "spools" / fam / "defaults"
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(spool, out)
            total += sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        out = dest / "hand" / f"{fam}.pickle.gz"
        gz_in, plain = src / "hand" / f"{fam}.pickle.gz", src / "hand" / f"{fam}.pickle"
        if gz_in.is_file() and gz_in.stat().st_size:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(gz_in, out)
        elif plain.is_file() and plain.stat().st_size:
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(plain, "rb") as fh, gzip.open(out, "wb", compresslevel=9) as gz:
                shutil.copyfileobj(fh, gz)
        if out.is_file():
            total += out.stat().st_size
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("--dest", type=Path, default=Path(__file__).resolve().parents[2] / "tests" / "fixtures" /
                    "fit_families")
    args = ap.parse_args()
    total = import_capture(args.src, args.dest)
    print(f"{args.dest}: {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
