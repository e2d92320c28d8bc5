"""The `ddpify` command line: a click group whose commands live in ddpify/commands/."""

from __future__ import annotations

import importlib
import pkgutil

import click

from ddpify import __version__, commands


SIGINT_EXIT = 130  # 128 + SIGINT, what shells report; 1 means "would change" under --check


class _Cli(click.Group):
    """The command group; Ctrl-C ends any command with exit status 130 instead of click's 1."""

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


def _register_commands() -> None:
    """Add every click command defined by a module in ddpify/commands/."""
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        for command in getattr(module, "COMMANDS", ()):
            cli.add_command(command)


_register_commands()


def main() -> None:
    """Console-script entry point."""
    cli()
