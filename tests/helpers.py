"""Shared test helpers: where the real fixtures live and which files form each captured run."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
REAL = FIXTURES / "real"

# folder -> (snapshot stems in time order, analyze options) from fixtures/real/README.md
REAL_RUNS: dict[str, tuple[list[str], dict]] = {
    "seed_adamw": (["before_training", "epoch0", "epoch1", "epoch2"], {}),
    "seed_sgd": (["before_training", "epoch0", "epoch1", "epoch2"], {}),
    "opt_state_first_step": (["before_step", "after_first_step"], {}),
    "frag_synthetic": (["fragmented", "oom"], {"limit": 8589934592}),
    "capacity": (["oom"], {"limit": 17179869184}),
    "external": (["oom"], {"device_total": 150109880320}),
    "frag_dynamic_probe": (["epoch0", "epoch1", "epoch2"], {}),
    "frag_dynamic_1.15": (["oom"], {"limit": 20244645632}),
    "frag_dynamic_expandable_1.15": (["epoch0", "epoch1", "epoch2"], {"limit": 20244645632}),
    "kept_loss_no_leak": ([f"step{i:04d}" for i in range(20, 401, 20)], {"limit": 21474836480}),
}


def meta(folder: str, root: Path = REAL) -> dict:
    return json.loads((root / folder / "meta.json").read_text())


def run_files(folder: str, root: Path = REAL) -> list[Path]:
    stems, _ = REAL_RUNS[folder]
    return [root / folder / f"{s}.pickle.gz" for s in stems]


def all_snapshot_files() -> list[Path]:
    return sorted(FIXTURES.rglob("*.pickle.gz")) + sorted(FIXTURES.rglob("*.pickle"))
