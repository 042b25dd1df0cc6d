"""`memq --help` lists the commands from memq.cli.HELP without importing their modules: each line must
be what click would print from the command's own docstring, at every terminal width."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from memq.cli import COMMANDS, HELP, cli


def test_every_command_has_one_help_line():
    assert sorted(HELP) == sorted(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_help_line_is_the_commands_own_at_every_width(name):
    cmd = cli.get_command(click.Context(cli), name)
    assert not cmd.hidden and not cmd.deprecated
    for limit in (20, 45, 60, 68, 100, 300):
        assert click.Command(name, help=HELP[name]).get_short_help_str(limit) == cmd.get_short_help_str(limit), limit


def test_help_lists_every_command_once():
    out = CliRunner().invoke(cli, ["--help"], terminal_width=200).output
    listed = [line.split()[0] for line in out.split("Commands:\n", 1)[1].splitlines() if line.strip()]
    assert listed == sorted(COMMANDS)
    assert "Diagnose snapshots of one run (in time order): .pickle, .pickle.gz, .zst, or a segment list." in out
