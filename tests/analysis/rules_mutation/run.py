"""Does every rule's boundary test fail when the rule changes? For each rule of rules.py, runs
tests/analysis/test_rule_boundaries.py with the rule 25% higher and 20% lower (a count one more and one
less) and reports the rules whose change no test notices. The docs-table test is left out: it fails for
any change and would hide the rest.

    python tests/analysis/rules_mutation/run.py   # ~3.5 minutes on 2 cores
"""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))


def fails(rule: str, factor: float, noop: bool = False) -> bool:
    env = {**os.environ, "MUT_RULE": rule, "MUT_FACTOR": str(factor),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    if noop:
        env["MUT_NOOP"] = "1"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "mutplugin", "-p", "no:cacheprovider",
                        "tests/analysis/test_rule_boundaries.py", "-k", "not docs_carry"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    return p.returncode != 0


def main() -> int:
    from memq.analysis.rules import RULES

    if fails(next(iter(RULES)), 1.25, noop=True):
        print("the unchanged rules already fail: fix the tests first")
        return 2
    missed = []
    for name in RULES:
        got = [fails(name, f) for f in (1.25, 0.8)]
        print(f"{name:40} higher: {'caught' if got[0] else 'MISSED'}  lower: {'caught' if got[1] else 'MISSED'}",
              flush=True)
        missed += [f"{name} {d}" for d, g in zip(("higher", "lower"), got, strict=True) if not g]
    print(f"{len(RULES)} rules, {2 * len(RULES) - len(missed)} of {2 * len(RULES)} changes caught")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
