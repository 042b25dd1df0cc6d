"""pytest plugin of the rules mutation check (run.py): loads profiler/analysis/rules.py before anything
imports the analysis, with one rule (MUT_RULE) multiplied by MUT_FACTOR, so every module that reads it
gets the changed value. MUT_NOOP=1 changes nothing (the check's control run)."""

import importlib.util
import os
import sys
from pathlib import Path

RULES_PY = Path(__file__).resolve().parents[3] / "profiler" / "analysis" / "rules.py"

spec = importlib.util.spec_from_file_location("memq.analysis.rules", RULES_PY)
mod = importlib.util.module_from_spec(spec)
sys.modules["memq.analysis.rules"] = mod  # the dataclass in it looks itself up there
spec.loader.exec_module(mod)

name, factor = os.environ["MUT_RULE"], float(os.environ["MUT_FACTOR"])
old = mod.RULES[name].value
if isinstance(old, int) and not isinstance(old, bool) and abs(old) <= 10:
    new = old + (1 if factor > 1 else -1)  # a count: one more or one less
else:
    new = type(old)(old * factor)
if os.environ.get("MUT_NOOP"):
    new = old
if name.startswith("STRENGTH["):
    mod.STRENGTH[name[len("STRENGTH["):-1]] = new
else:
    setattr(mod, name, new)
