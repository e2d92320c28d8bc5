"""`ddpify server`: the language server (ddpify/server.py), which needs the `server` extra (pygls)."""

from __future__ import annotations

import click

from ddpify.exit_codes import EXIT_ERROR

SERVER_EXTRA_MODULES = ("pygls", "lsprotocol")
MISSING_PYGLS = 'error: ddpify server needs pygls, which is not installed: pip install "ddpify[server]"'


@click.command("server")
@click.option("--unsafe-fixes", is_flag=True, help="Offer unsafe fixes as code actions too (like `ddpify lint --unsafe-fixes`).")
@click.pass_context
def server_command(ctx: click.Context, unsafe_fixes: bool) -> None:
    """Run the language server over stdin/stdout for editors: lint findings as diagnostics, their
    fixes as code actions, rule docs on hover, and the command ddpify.convertToDDP.

    Findings follow [tool.ddpify] in the pyproject.toml nearest each file, as `ddpify lint` does.
    """
    try:
        from ddpify.server import serve
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in SERVER_EXTRA_MODULES:
            raise
        click.echo(MISSING_PYGLS, err=True)
        ctx.exit(EXIT_ERROR)
    serve(unsafe_fixes=unsafe_fixes)


COMMANDS = (server_command,)
