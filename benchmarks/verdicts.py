"""Every fixture's verdict, one JSON line each, to compare two versions of the analysis.

A change that only moves code (a rules table, a new module) must leave every verdict as it was; this
prints what a reader compares: for each real snapshot alone (and with the limit it was recorded
under), each recorded run (with its OOM message, and with each optimizer), the primary cause, every
cause with its confidence, the playbook entries advised in order, the failing step's verdict and the
forecast's step.

    python benchmarks/verdicts.py > after.jsonl
    git worktree add /tmp/before <commit> && (cd /tmp/before && python benchmarks/verdicts.py) > before.jsonl
    diff before.jsonl after.jsonl

It reads only the analysis' public entry points, so it runs on older trees as well (copy it there).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))

from memq.analysis import analyze  # noqa: E402
from memq.load import load_snapshot_file  # noqa: E402
from memq.model import OomContext  # noqa: E402
from memq.oom_message import parse_oom_message  # noqa: E402
from tests.analysis.agent_data import rank_folder, spool_run, step_need_truth  # noqa: E402
from tests.analysis.test_captured_labels import CAPTURED, CASES  # noqa: E402
from tests.helpers import REAL, REAL_RUNS, run_files  # noqa: E402

FORECAST = ROOT / "tests" / "fixtures" / "forecast"


def verdict(result: dict) -> dict:
    d = result["diagnosis"]
    need = d.get("step_need") or {}
    forecast = result.get("forecast") or {}
    return {
        "primary": d["primary_cause"], "confidence": d["confidence"],
        "causes": [(c["cause"], c["confidence"]) for c in d["causes"]],
        "advice": [r.get("playbook") for r in d["recommendations"]],
        "step_need": [need.get("bytes"), need.get("fits_limit")], "forecast_step": forecast.get("step"),
    }


def cases():
    """(label, files, context, optimizer) for every real fixture and recorded run."""
    for f in sorted(CAPTURED.rglob("*.pickle.gz")) + sorted(REAL.rglob("*.pickle.gz")):
        yield f"{f.relative_to(ROOT)} alone", [f], None, None
        for folder, (_, cap) in CASES.items():
            if f.parent == CAPTURED / folder and cap:
                yield f"{f.relative_to(ROOT)} with its cap", [f], OomContext(limit_bytes=cap), None
        for folder, (_, opts) in REAL_RUNS.items():
            if f.parent == REAL / folder and opts:
                ctx = OomContext(limit_bytes=opts.get("limit"), device_total_bytes=opts.get("device_total"))
                yield f"{f.relative_to(ROOT)} with its limit", [f], ctx, None
    for folder, (stems, cap) in CASES.items():
        files = [CAPTURED / folder / f"{s}.pickle.gz" for s in stems]
        yield f"captured run {folder}", files, OomContext(limit_bytes=cap), None
        msg = json.loads((CAPTURED / folder / "meta.json").read_text()).get("oom_message")
        if msg:
            yield f"captured run {folder} + message", files, OomContext(message=parse_oom_message(msg)), None
    for folder, (_, opts) in REAL_RUNS.items():
        ctx = OomContext(limit_bytes=opts.get("limit"), device_total_bytes=opts.get("device_total"))
        for opt in (None, "AdamW", "SGD"):
            yield f"real run {folder} ({opt or 'no optimizer named'})", run_files(folder), ctx, opt


def spool_cases():
    """(label, spool folder, cap) for the agent's spools: the step-need and forecast calibration runs,
    at the agent's defaults and at full history, analysed whole as the worker would."""
    for sc in sorted(step_need_truth()):
        for variant in ("defaults", "full"):
            yield f"step-need run {sc}/{variant}", rank_folder(sc, variant), None
    truth = json.loads((FORECAST / "truth.json").read_text())
    for sc, variants in sorted(truth.items()):
        for variant, row in sorted(variants.items()):
            yield f"forecast run {sc}/{variant}", next((FORECAST / sc / variant).iterdir()), row.get("cap_bytes")


def main() -> int:
    n = 0
    for label, files, ctx, opt in cases():
        snaps = [load_snapshot_file(f) for f in files]
        kwargs = {"optimizer": opt} if opt else {}
        result = analyze(snaps, ctx, names=[str(f) for f in files], **kwargs)
        print(json.dumps({"case": label, **verdict(result)}, sort_keys=True))
        n += 1
    for label, folder, cap in spool_cases():
        snaps, ctx, triggers = spool_run(folder)
        if ctx is None and cap:
            ctx = OomContext(limit_bytes=cap)
        result = analyze(snaps, ctx, triggers=triggers)
        print(json.dumps({"case": label, **verdict(result)}, sort_keys=True))
        n += 1
    print(f"{n} verdicts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
