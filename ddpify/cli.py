"""The `ddpify` command line: a click group whose commands live in ddpify/commands/.

A command's module is imported when the command runs (or when `--help` lists them all): `ddpify
lint` never loads the codemods' LibCST machinery, which would double its start-up.
"""

from __future__ import annotations

import importlib

import click

from ddpify import __version__, commands


SIGINT_EXIT = 130  # 128 + SIGINT, what shells report; 1 means "would change" under --check


class _Cli(click.Group):
    """The command group: commands loaded on first use (commands.MODULE_OF); Ctrl-C ends any command
    with exit status 130 instead of click's 1."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(commands.MODULE_OF)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in commands.MODULE_OF:
            return None
        module = importlib.import_module(f"{commands.__name__}.{commands.MODULE_OF[cmd_name]}")
        return next(command for command in module.COMMANDS if command.name == cmd_name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("\nInterrupted.", err=True)
            ctx.exit(SIGINT_EXIT)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ddpify")
def cli() -> None:
    """Convert single-GPU PyTorch training scripts to multi-GPU ones, and lint multi-GPU scripts."""


def main() -> None:
    """Console-script entry point."""
    cli()
