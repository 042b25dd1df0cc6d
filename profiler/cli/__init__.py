"""The `memq` command. Commands live one family per module and load lazily, so `memq analyze`
never imports sqlalchemy or celery. Errors are mapped to exit codes here, and only here."""

from __future__ import annotations

import importlib
import sys

import click

from memq.errors import EXIT_ERROR, MemqError
from memq.render.safe import safe_text

# command name -> "module:function". One line per command; modules import their heavy deps.
COMMANDS: dict[str, str] = {
    "analyze": "memq.cli.analyze:analyze",
    "explain": "memq.cli.analyze:explain",
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
    "worker": "memq.cli.service:worker",
    "dispatcher": "memq.cli.service:dispatcher",
    "status": "memq.cli.service:status",
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


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

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
