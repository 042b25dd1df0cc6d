"""`memq run --run R --cluster C -- CMD...`: run a training command with the agent in every process.

The agent starts from a `sitecustomize` that this command puts on PYTHONPATH (see
profiler/agent/bootstrap.py for why and what it covers); CMD is exec'd, so signals reach it directly
and its exit status is memq's."""

from __future__ import annotations

import os
import shutil

import click

from memq.agent.bootstrap import child_env
from memq.errors import BadInput
from memq.names import check_name


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--run", "run_name", required=True, help="Run name; all ranks and restarts share it.")
@click.option("--cluster", required=True, help="Cluster name.")
@click.option("--job", default=None, help="Scheduler job id (default: SLURM_JOB_ID, TORCHELASTIC_RUN_ID, ...).")
@click.option("--redis-url", default=None, help="Overrides MEMQ_REDIS_URL (redis:// or rediss://).")
@click.option("--spool-dir", default=None, help="Overrides MEMQ_SPOOL_DIR.")
@click.option("--history", type=click.Choice(["auto", "on", "off"]), default=None,
              help="Allocator history recording (default auto: first steps, one step per periodic snapshot, "
                   "on near the limit).")
@click.option("--snapshot-every", "snapshot_every_s", type=int, default=None,
              help="Seconds between periodic snapshots.")
@click.option("--stats-interval", "stats_interval_s", type=int, default=None, help="Seconds between stats samples.")
@click.option("--signal", "signal_name", default=None, help="Signal that takes a snapshot (default SIGUSR2).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(run_name, cluster, job, redis_url, spool_dir, history, snapshot_every_s, stats_interval_s, signal_name,
        command):
    """Run COMMAND (after `--`) with the memq agent started in each of its Python processes."""
    # The names ingest, push and the dispatcher accept, refused here before the job starts (not
    # dead-lettered once it has run for hours).
    check_name("run", run_name)
    check_name("cluster", cluster)
    check_name("job", job, required=False)

    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise BadInput("no command given", hint="memq run --run R --cluster C -- python train.py")
    exe = shutil.which(cmd[0])
    if exe is None:
        raise BadInput(f"command not found: {cmd[0]}")
    if not _gpu_visible():
        click.echo(f"memq run: no GPU device is visible here ({GPU_DEVICES} absent, or CUDA_VISIBLE_DEVICES empty):"
                   f" the agent records nothing without CUDA, so run {run_name!r} will have no data; the "
                   "command runs anyway", err=True)
    env = child_env(run_name, cluster, job=job, settings={
        "MEMQ_REDIS_URL": redis_url, "MEMQ_SPOOL_DIR": spool_dir, "MEMQ_AGENT_HISTORY": history,
        "MEMQ_SNAPSHOT_EVERY_S": snapshot_every_s, "MEMQ_STATS_INTERVAL_S": stats_interval_s,
        "MEMQ_AGENT_SIGNAL": signal_name})
    os.execve(exe, cmd, env)


GPU_DEVICES = "/dev/nvidia0"


def _gpu_visible() -> bool:
    """A CUDA device could be used: the driver's device node exists (NVIDIA) and CUDA_VISIBLE_DEVICES
    does not hide every device. Cheap: no torch import before the job's own."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists(GPU_DEVICES)
