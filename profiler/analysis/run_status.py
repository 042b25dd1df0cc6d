"""The one rule a run's status moves by (pure). Every writer asks it: the dispatcher (run_end, an OOM
snapshot arriving), the worker (an analysed OOM, a run diagnosis with one) and `memq ingest`.

- A status only moves up RUN_STATUSES (memq/model.py): running < completed < crashed < oom. An OOM is
  never downgraded by a late `run_end: completed` or `crashed` (a launcher tears the other ranks down
  after one ran out of memory), and a run that crashed and whose snapshots show an OOM is `oom`.
- A status a person gives (`memq ingest --status`) is set as given: a correction of the record.
- A run_end status this version does not know reads as `completed` (the envelope maps the legacy
  `error` to `crashed` first).
- An analysed snapshot that is an OOM one (its trigger, the request its analysis found, its OOM figures)
  moves its run to `oom`; so does a run diagnosis that found one.
- `memq ingest` without `--status`: `oom` when the run diagnosis of the files found one, `completed` for
  a run the ingest created, else the status stays.
"""

from __future__ import annotations

from memq.errors import BadInput
from memq.model import RUN_STATUSES


def check_status(status: str) -> str:
    if status not in RUN_STATUSES:
        raise BadInput(f"run status {status!r} is not one of {', '.join(RUN_STATUSES)}")
    return status


def replaced_by(status: str, *, given: bool = False) -> tuple[str, ...]:
    """The stored statuses that `status` replaces: those below it, or every one when a person gave it."""
    check_status(status)
    return RUN_STATUSES if given else RUN_STATUSES[:RUN_STATUSES.index(status)]


def moves(current: str | None, status: str, *, given: bool = False) -> bool:
    """Whether a run at `current` (None: no status yet) takes `status`."""
    return current is None or current in replaced_by(status, given=given)


def from_run_end(sent: str | None) -> str:
    """The status a rank's run_end moves its run to."""
    return sent if sent in RUN_STATUSES else "completed"


def after_ingest(given: str | None, oom: bool, created: bool) -> str | None:
    """The status `memq ingest` moves a run to (None: it stays)."""
    if given is not None:
        return check_status(given)
    return "oom" if oom else ("completed" if created else None)


def after_snapshot(trigger: str | None, oom_requested_bytes: int | None = None, oom: object = None) -> str | None:
    """The status a snapshot moves its run to (None: it stays): `oom` for an OOM snapshot, by its trigger
    (as it arrives) or by its analysis (the failed request, the OOM figures)."""
    return "oom" if trigger == "oom" or oom_requested_bytes is not None or bool(oom) else None


def after_diagnosis(result: dict | None) -> str | None:
    """The status a rank's run diagnosis moves its run to (None: it stays)."""
    return "oom" if result and result.get("oom") else None
