"""The `memq` command. Commands live one family per module, each importing its own dependencies at
module level; the group imports only the module of the command that runs (and `memq --help` none), so
`memq analyze` never imports sqlalchemy or celery. Errors are mapped to exit codes here, and only here."""

from __future__ import annotations

import importlib
import sys

import click

from memq.errors import EXIT_ERROR, BadInput, MemqError
from memq.model import OomContext
from memq.render.safe import safe_text
from memq.units import parse_size

# command name -> "module:function". One line per command; modules import their heavy deps.
COMMANDS: dict[str, str] = {
    "analyze": "memq.cli.analyze:analyze",
    "explain": "memq.cli.explain:explain",
    "run": "memq.cli.run:run",
    "db": "memq.cli.db:db",
    "ingest": "memq.cli.ingest:ingest",
    "reanalyze": "memq.cli.ingest:reanalyze",
    "runs": "memq.cli.history:runs",
    "history": "memq.cli.history:history",
    "compare": "memq.cli.history:compare",
    "versions": "memq.cli.history:versions",
    "demo": "memq.cli.demo:demo",
    "whatif": "memq.cli.whatif:whatif",
    "fit": "memq.cli.fit:fit",
    "push": "memq.cli.push:push",
    "worker": "memq.cli.worker:worker",
    "dispatcher": "memq.cli.dispatcher:dispatcher",
    "status": "memq.cli.status:status",
    "report": "memq.cli.report:report",
    "plot": "memq.cli.report:plot",
    "doctor": "memq.cli.doctor:doctor",
    "gc": "memq.cli.gc:gc",
    "exporter": "memq.cli.exporter:exporter",
    "serve": "memq.cli.serve:serve",
    "view": "memq.cli.view:view",
    "playbook": "memq.cli.playbook:playbook",
    "relay": "memq.cli.relay:relay",
    "key": "memq.cli.key:key",
}


# command name -> the first paragraph of its docstring, which `memq --help` shortens as click does, so
# that listing the commands imports none of them (tests/cli/test_lazy_commands.py holds the two equal).
HELP: dict[str, str] = {
    "analyze": "Diagnose snapshots of one run (in time order): .pickle, .pickle.gz, .zst, or a segment list.",
    "compare": "Two runs side by side: peaks, composition deltas, settings that differ, and what explains the gap.",
    "db": "Create or migrate the run history database (MEMQ_DATABASE_URL).",
    "demo": "Analyse a few real H200 snapshots into the local history and show what memq finds.",
    "dispatcher": "Move the agents' stream into the history and enqueue analyses, until SIGTERM.",
    "doctor": "Check the database, Redis, stream, workers and blob store; print a fix for each problem.",
    "explain": "Diagnose from the OOM message alone (\"CUDA out of memory. Tried to allocate ...\").",
    "exporter": "Serve Prometheus metrics: snapshots, OOMs, verdicts, headroom, stream lag, workers.",
    "fit": "Will batch B (or length T) fit? Replays a measured training step at the new shape.",
    "gc": "Remove raw blobs and stat samples past the retention policy.",
    "history": "A run's snapshots in time order, its diagnosis, what changed, and a memory timeline.",
    "ingest": "Analyse snapshot FILEs of one run (in time order) and store them in the run history.",
    "key": "Signing keys of the agents and the dispatcher's keyring.",
    "playbook": "List the playbook's entries, or print the section of ENTRY_ID (e.g. `memq playbook empty-cache`).",
    "plot": "A run's memory timeline: reserved, allocated, the limit, snapshots and the OOM.",
    "push": "Send snapshot FILEs of one run (in time order) to the ingest stream, as the agent does.",
    "reanalyze": "Recompute stored results from the raw snapshots with this memq's analyzer version.",
    "relay": "Load the relay library into Redis (FUNCTION LOAD REPLACE when missing or older), or show its version.",
    "report": "OOMs and near misses by cause, regressions, fragmentation and growth for one UTC day.",
    "run": "Run COMMAND (after `--`) with the memq agent started in each of its Python processes.",
    "runs": "List runs, newest first.",
    "serve": "Runs, snapshots, comparisons and reports in a browser, with the JSON API behind every page.",
    "status": "Backlog and health of the ingest path: stream, queues, dead letters, workers.",
    "versions": "Peak memory, OOM rate and fragmentation of a job per torch version; regressions flagged.",
    "view": "Draw the last of FILES (one run's snapshots in time order) with the diagnosis of all of them.",
    "whatif": "Would another allocator setting have avoided this OOM? Replays the recorded alloc/free trace.",
    "worker": "Run a Celery worker for memq (other options go to `celery worker` unchanged).",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx, formatter):
        """click's listing, from HELP: it would import every command module for its docstring, and
        each module imports its own dependencies (sqlalchemy, celery, starlette, ...) at module level."""
        limit = formatter.width - 6 - max(map(len, HELP))
        with formatter.section("Commands"):
            formatter.write_dl([(n, click.Command(n, help=HELP[n]).get_short_help_str(limit)) for n in sorted(HELP)])

    def invoke(self, ctx):
        """Every command's MemqError ends here: one line and its exit code (2 bad input, 4 unknown
        run, ...), no traceback, whether the console script or a CliRunner runs the command."""
        try:
            return super().invoke(ctx)
        except MemqError as exc:
            click.echo(f"memq: error: {safe_text(exc)}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="memq")
def cli() -> None:
    """memq: evidence from the CUDA caching allocator for PyTorch out-of-memory failures."""


# The option types every command family shares (here, where any command module imports them for nothing).
class SizeType(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except BadInput as exc:
            self.fail(str(exc), param, ctx)


SIZE = SizeType()


def build_context(limit: int | None, device_total: int | None, oom_message: str | None,
                  requested: int | None = None) -> OomContext:
    msg = None
    if oom_message is not None:  # an empty one (a `grep` that found nothing) is refused, never dropped
        from memq.oom_message import parse_oom_message  # `memq analyze FILE` parses no message: pinned

        msg = parse_oom_message(oom_message)
    return OomContext(requested_bytes=requested, limit_bytes=limit, device_total_bytes=device_total, message=msg)


def oom_options(f):
    f = click.option("--oom-message", metavar="TEXT", help="The 'CUDA out of memory...' text from the log.")(f)
    f = click.option("--device-total", type=SIZE, help="Device memory in bytes or units (e.g. 139.8GiB).")(f)
    f = click.option("--limit", type=SIZE,
                     help="What the allocator may reserve (per-process cap), bytes or units (e.g. 16GiB).")(f)
    return f



_KEPT: list = []


def keep_until_exit(*objs) -> None:
    """Hold what a command built (a million parsed trace events) until the process ends, and end it
    without freeing them object by object (0.14 s for a 1M-event snapshot): the console script exits
    through os._exit once the output is flushed. In-process callers (tests, CliRunner) free it later."""
    _KEPT.append(objs)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="memq", standalone_mode=False)
        if argv is None and _KEPT:
            sys.stdout.flush()
            sys.stderr.flush()
            __import__("os")._exit(0)
    except click.exceptions.Abort:
        click.echo("memq: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # noqa: BLE001 - last resort: one line, not a traceback, for users
        if "MEMQ_DEBUG" in __import__("os").environ:
            raise
        click.echo(f"memq: internal error: {type(exc).__name__}: {safe_text(exc)} (set MEMQ_DEBUG=1 for a traceback)",
                   err=True)
        sys.exit(EXIT_ERROR)
