"""`ddpify mcp`: the Model Context Protocol server for coding agents (ddpify/mcp_server.py), which
needs the `mcp` extra (the mcp SDK 2.x)."""

from __future__ import annotations

from pathlib import Path

import click

from ddpify.exit_codes import EXIT_ERROR

MISSING_MCP = 'error: ddpify mcp needs the mcp SDK, which is not installed: pip install "ddpify[mcp]"'


@click.command("mcp")
@click.option("--root", type=click.Path(exists=True, file_okay=False, path_type=Path), default=".", show_default=True,
              help="The workspace root: every path a tool is given must lie inside it (symlinks resolved).")
@click.option("--allow-verify", is_flag=True,
              help="Enable the verify tool, which RUNS scripts under the root (as `ddpify verify` does).")
@click.pass_context
def mcp_command(ctx: click.Context, root: Path, allow_verify: bool) -> None:
    """Run the MCP server over stdin/stdout for coding agents: tools convert, lint, explain and
    (with --allow-verify) verify. Only verify executes code. Client set-up: docs/agents.md."""
    try:
        from ddpify.mcp_server import serve
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in ("mcp", "mcp_types"):
            raise
        click.echo(MISSING_MCP, err=True)
        ctx.exit(EXIT_ERROR)
    serve(root, allow_verify)


COMMANDS = (mcp_command,)
