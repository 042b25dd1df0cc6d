"""`memq worker [CELERY WORKER OPTIONS]`: Celery's own worker for `memq.workers.app` (the same as
`celery -A memq.workers.app worker ...`); memq adds defaults for the queues and the prefork pool.
`memq dispatcher` and `memq status` live in their own modules, free of Celery."""

from __future__ import annotations

import click

from memq.workers.app import app


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("-Q", "--queues", default="memq.ingest,memq.analyze,memq.report", show_default=True)
@click.option("-c", "--concurrency", type=int, help="Pool processes (default: Celery's, the CPU count).")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.option("-B", "--beat", is_flag=True,
              help="Also run the beat scheduler, for development (run exactly one beat). Deployments run "
                   "`celery -A memq.workers.app beat` as its own process: a worker with an embedded beat "
                   "can stop consuming after a Redis restart.")
@click.pass_context
def worker(ctx, queues, concurrency, loglevel, beat):
    """Run a Celery worker for memq (other options go to `celery worker` unchanged)."""
    argv = ["worker", "-Q", queues, "-l", loglevel, "-P", "prefork"]
    if concurrency:
        argv += ["-c", str(concurrency)]
    if beat:
        argv.append("-B")
    argv += list(ctx.args)
    app.worker_main(argv=argv)
