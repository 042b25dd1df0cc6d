"""`MemqTask`, the base of every memq task.

- Retries, with exponential back-off and jitter, only for outages (`memq.workers.runtime.is_transient`:
  the database or Redis unreachable or not ready, kombu connection errors). The back-off is
  capped far below the broker's visibility timeout (retries are ETA messages). Anything else is
  raised as it is: never retried.
- Bad data (`BadInput`: a refused pickle, a truncated blob, a snapshot that does not parse) is never
  retried: the task body quarantines it (snapshot state `failed` with the reason, plus a dead
  letter) and returns normally. `throws` marks it as expected, so Celery logs no traceback.
- Late acknowledgement and reject-on-worker-lost come from the app configuration.
"""

from __future__ import annotations

import logging

import redis
from celery import Task
from celery.utils.time import get_exponential_backoff_interval
from kombu.exceptions import OperationalError

from memq.errors import BadInput, BrokerUnavailable, StorageUnavailable
from memq.workers.app import settings_of
from memq.workers.runtime import is_transient

log = logging.getLogger("memq.workers")


def transient_errors() -> tuple[type[BaseException], ...]:
    """The exception classes that may be outages (`is_transient` decides for an instance)."""
    return (StorageUnavailable, BrokerUnavailable, redis.ConnectionError, redis.TimeoutError, redis.ResponseError,
            OperationalError)


class MemqTask(Task):
    abstract = True
    throws = (BadInput,)
    acks_late = True
    reject_on_worker_lost = True
    ignore_result = True
    #: False for periodic tasks: the next beat tick is their retry.
    retry_on_outage = True

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except BadInput:
            raise
        except transient_errors() as exc:
            if not self.retry_on_outage or not is_transient(exc):
                raise
            raise self.retry_later(exc) from exc

    def retry_later(self, exc: BaseException, **kwargs_update):
        """The Retry to raise for a transient error: exponential back-off with full jitter, capped at
        MEMQ_RETRY_BACKOFF_MAX_S, at most MEMQ_TASK_MAX_RETRIES times (then the task fails and the
        SQL state, still pending or leased, is re-driven by the reaper). `kwargs_update` changes the
        arguments of the next attempt (e.g. the lease it holds)."""
        st = settings_of(self.app)
        countdown = get_exponential_backoff_interval(factor=1, retries=self.request.retries,
                                                     maximum=st.retry_backoff_max_s, full_jitter=True)
        log.warning("%s[%s] retry %d in %.1f s: %s", self.name, self.request.id, self.request.retries + 1,
                    countdown, exc)
        kwargs = dict(self.request.kwargs or {}, **kwargs_update)
        return self.retry(exc=exc, countdown=max(0.2, countdown), max_retries=st.task_max_retries,
                          kwargs=kwargs)
