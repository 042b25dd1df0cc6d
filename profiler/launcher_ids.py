"""Placeholder ids that launchers put where a job id would be, recognised so they are never stored
as a job id (pure: no I/O).

torchrun's rendezvous id defaults to "none" (TORCHELASTIC_RUN_ID=none in every process it starts);
SLURM prints "(null)" for unset fields and batch scripts leak unexpanded "%j" / "$SLURM_JOB_ID";
Kubernetes templates and CI tools leave "default", "undefined" or "null". Grouping runs by such a
"job" would merge every unrelated job of a cluster into one history.
"""

from __future__ import annotations

import re

PLACEHOLDERS = frozenset({"", "none", "null", "(null)", "nil", "default", "undefined", "unknown", "unset",
                          "n/a", "na", "-", "?"})
_UNEXPANDED = re.compile(r"^(\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|%[A-Za-z]|\{\{.*\}\})$")


def is_placeholder(value: str | None) -> bool:
    if value is None:
        return True
    v = str(value).strip()
    return v.lower() in PLACEHOLDERS or bool(_UNEXPANDED.match(v))


def real_id(value: str | None) -> str | None:
    """The value, or None when it is a launcher's placeholder."""
    return None if is_placeholder(value) else str(value).strip()
