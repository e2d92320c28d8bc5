"""`ddpify mcp`: ddpify for coding agents, as a Model Context Protocol server over stdio. Needs the
mcp SDK 2.x: `pip install "ddpify[mcp]"`.

Tools: `convert`, `lint` and `explain` read a script and never run it; `verify` runs the original and
its conversion as `ddpify verify` does, and only when the server was started with --allow-verify.
A script is given as its text (`source`) or as a `path` inside the workspace root named at start:
a path is resolved (symlinks followed) and refused when it names `..` or leaves the root. The server
works from the root, so relative paths, the project's imports and verify's copy of the working
directory are what `ddpify` run from the root would see.

Nothing here converts, lints, explains or verifies on its own: `convert_entry` / `convert_source`,
`lint_text`, `explain_source` and verify's runner do, as for the CLI. A refusal, a bad argument or a
failure is a tool error (isError, one line saying what and why), never a traceback or a hung server.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from ddpify import __version__
from ddpify.commands.explain import conversion_data, explain_source, render_text
from ddpify.convert import TARGETS, convert_source
from ddpify.lint.config import ConfigError, config_for, upper_all
from ddpify.lint.engine import NOTEBOOK_SUFFIX, Options, lint_text
from ddpify.lint.output import json_diagnostic
from ddpify.lint.registry import all_rules
from ddpify.project_conversion import FileJob, convert_entry
from ddpify.review import unified_diff
from ddpify.sources import Source, SourceError, check_syntax, read_source
from ddpify.verify.runner import Request, verify as verify_pair

SOURCE_NAME = "<source>"  # what a script given as text is called in findings and diffs
MAX_VERIFY_TIMEOUT_S = 600.0

Target = Literal[TARGETS]
ScriptText = Annotated[str | None, Field(description="The script's text. Give this or `path`, not both.")]
ScriptPath = Annotated[str | None, Field(description="A script inside the workspace root (relative to it, or absolute). Give this or `source`.")]
BatchSize = Annotated[Literal["per-gpu", "global"], Field(description="per-gpu: every GPU keeps the script's batch size; global: it is divided by the world size.")]

INSTRUCTIONS = """ddpify converts single-GPU PyTorch training scripts to DDP, DataParallel, FSDP2 or Accelerate,
lints multi-GPU scripts, and proves a conversion trains the same by running both (verify).
convert, lint and explain only read code. A conversion is "converted", "nothing to do" (with the
reason) or "incomplete" (the missing items say what is left to do by hand): never present an
incomplete conversion as finished."""


class Workspace:
    """The root every path must stay inside, and whether scripts may be run (--allow-verify)."""

    def __init__(self, root: str | os.PathLike, allow_verify: bool) -> None:
        self.root = Path(root).resolve(strict=True)
        self.allow_verify = allow_verify
        self.verifying = threading.Lock()  # one verify at a time: each kills whatever its run left behind

    def resolve(self, path: str) -> Path:
        """The file `path` names, symlinks followed; a tool error unless it is a file inside the root."""
        given = Path(path)
        if ".." in given.parts:
            raise ToolError(f"{path}: '..' is refused; name a file inside the workspace root {self.root}")
        resolved = (self.root / given).resolve()
        if not resolved.is_relative_to(self.root):
            raise ToolError(f"{path}: outside the workspace root {self.root}; refused")
        if not resolved.is_file():
            raise ToolError(f"{path}: no such file under the workspace root {self.root}")
        if resolved.suffix == NOTEBOOK_SUFFIX:
            raise ToolError(f"{path}: notebooks are not served over MCP; run `ddpify` on it from the command line")
        return resolved

    def script(self, source: str | None, path: str | None) -> tuple[str, str, Path | None]:
        """(text, name, file) of the script a tool was given, checked to parse; `file` is None for text."""
        if (source is None) == (path is None):
            raise ToolError("give exactly one of `source` (the script's text) and `path` (a file under the workspace root)")
        if path is not None:
            file = self.resolve(path)
            script = read_source(file)
            name = file.relative_to(self.root).as_posix()
        else:
            file, name = None, SOURCE_NAME
            script = Source(path=name, text=source, encoding="utf-8", bom=False, mode=None)
        check_syntax(script)
        return script.text, name, file


@contextmanager
def tool_errors(doing: str) -> Iterator[None]:
    """Turn what goes wrong inside into a tool error the agent can read: a bad file says which and
    where; anything else is ddpify's own failure, named as such."""
    try:
        yield
    except ToolError:
        raise
    except SourceError as error:
        raise ToolError(str(error)) from None
    except Exception as error:
        raise ToolError(f"internal error while {doing} ({type(error).__name__}: {error}); please report it") from None


class DdpifyTools:
    """The tools, each a method whose signature is its input schema and whose docstring the agent reads."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    def convert(self, source: ScriptText = None, path: ScriptPath = None, target: Target = "ddp",
                batch_size: BatchSize = "per-gpu", eval: Literal["shard", "whole"] = "shard",
                log_loss: Literal["reduced", "rank0"] = "reduced", checkpoint: Literal["full", "sharded"] = "full",
                mixed_precision: Literal["keep", "policy"] = "keep") -> dict[str, Any]:
        """Convert a single-GPU PyTorch training script to multi-GPU (`ddpify convert --to TARGET`); reads
        the script, never runs it, writes nothing. Returns the converted source (`output`), a unified
        `diff`, and the outcome: `status` converted, nothing to do (`note` says why) or incomplete
        (`missing`: each item's line, what is missing and what to do by hand), with `changes` and
        `advice` by original line. For a `path`, the project modules it imports are converted with it:
        those that change are in `modules`. Options are `ddpify convert`'s (see its --help)."""
        if target != "fsdp" and (checkpoint, mixed_precision) != ("full", "keep"):
            raise ToolError("checkpoint and mixed_precision apply to target fsdp only")
        options = {"batch_size": batch_size, "eval": eval, "log_loss": log_loss, "checkpoint": checkpoint,
                   "mixed_precision": mixed_precision}
        with tool_errors("converting"):
            text, name, file = self.workspace.script(source, path)
            if file is None:
                result, modules = convert_source(text, target, path=name, **options), []
            else:
                project = convert_entry(file, target, options)
                result = project.job(file).convert()
                modules = [self.module_data(job) for job in project.jobs if job.changed and not job.entry]
            return {**conversion_data(result, target), "reason": result.reason, "output": result.output,
                    "diff": unified_diff(name, result.source, result.output), "modules": modules}

    def module_data(self, job: FileJob) -> dict[str, Any]:
        """A project module converted with its entry: its path under the root, status, output and diff."""
        result = job.convert()
        name = job.path.resolve().relative_to(self.workspace.root).as_posix()
        return {"path": name, "status": result.status.value, "output": result.output,
                "diff": unified_diff(name, result.source, result.output)}

    def lint(self, source: ScriptText = None, path: ScriptPath = None,
             fix: Annotated[bool, Field(description="Apply the fixes (safe ones; unsafe too with unsafe_fixes) and return the fixed source.")] = False,
             unsafe_fixes: bool = False,
             select: Annotated[list[str] | None, Field(description="Rule codes or prefixes to run instead of the config's (ALL: every rule).")] = None,
             ignore: Annotated[list[str] | None, Field(description="Rule codes or prefixes to skip instead of the config's.")] = None) -> dict[str, Any]:
        """Lint a PyTorch script for multi-GPU pitfalls (`ddpify lint`), with [tool.ddpify] from the
        nearest pyproject.toml; never runs the script. Returns `findings` (as `ddpify lint
        --output-format json`: rule code, range, message, severity and the fix's edits, if any),
        `fixable` (how many fixes --fix would apply), `errors`, and with `fix`: `fixed_source`,
        `fixes_applied` and the findings left after fixing. `skipped`: the script never mentions torch."""
        with tool_errors("linting"):
            text, name, file = self.workspace.script(source, path)
            try:
                config = config_for(str(file or self.workspace.root))
                config = config.with_overrides(upper_all(select) if select is not None else None,
                                               upper_all(ignore) if ignore is not None else None, None)
                config.validate(all_rules())
            except ConfigError as error:
                raise ToolError(f"ddpify: {error}") from None
            options = Options(config=config, fix=fix, unsafe_fixes=unsafe_fixes)
            report, fixed = lint_text(text, name, options)
            answer = {"findings": [json_diagnostic(d) for d in report.diagnostics], "errors": report.errors,
                      "fixable": sum(options.wants(d.fix) for d in report.diagnostics), "skipped": report.skipped}
            if fix:
                answer.update(fixed_source=fixed, fixes_applied=report.fixes_applied)
            return answer

    def explain(self, source: ScriptText = None, path: ScriptPath = None, target: Target = "ddp") -> dict[str, Any]:
        """What ddpify finds in a training script and what a conversion to `target` would change
        (`ddpify explain --json`; `report` is its text form): models, optimizers, loaders, loops,
        backward and step lines, side effects (prints, logging, saves) and the conversion's outcome.
        Never runs the script."""
        with tool_errors("explaining"):
            text, name, _ = self.workspace.script(source, path)
            info = explain_source(text, name, target)
            return {**info, "report": render_text(info)}

    def verify(self, path: Annotated[str, Field(description="The single-GPU script, inside the workspace root.")],
               target: Target = "ddp", nproc: Annotated[int, Field(ge=1, le=8)] = 2,
               steps: Annotated[int, Field(ge=1, le=100)] = 8, batch_size: BatchSize = "per-gpu",
               timeout: Annotated[float, Field(ge=1, le=MAX_VERIFY_TIMEOUT_S, description="Seconds before a run still going counts as hung.")] = 60,
               script_args: Annotated[list[str] | None, Field(description="Arguments for the script (both runs).")] = None) -> dict[str, Any]:
        """RUNS the script and its conversion (`ddpify verify --to TARGET` on CPU): the original as one
        process and the converted script as `nproc` ranks, each in a private copy of the workspace,
        then compares loss and parameters after every optimizer step. Only when the server was started
        with --allow-verify. Returns the verdict: equivalent, diverged (`diverged_at`), not_converted
        or error, with `message`, per-step rows, and for a hang each rank's stuck line. Every process
        it starts is killed at the end; it takes up to `timeout` plus half a minute."""
        if not self.workspace.allow_verify:
            raise ToolError("verify runs your scripts, and this server was started without --allow-verify: "
                            "restart it as `ddpify mcp --allow-verify` to allow it")
        with tool_errors("verifying"):
            file = self.workspace.resolve(path)
            script = file.relative_to(self.workspace.root).as_posix()
            request = Request(script=script, target=target, against=None, nproc=nproc, steps=steps, device="cpu",
                              batch_mode=batch_size, timeout=timeout, launcher="fork", script_args=tuple(script_args or ()),
                              root=str(self.workspace.root))  # never a mirror of more than the workspace
            with self.workspace.verifying:
                return verify_pair(request)


def build_server(root: str | os.PathLike, allow_verify: bool = False) -> MCPServer:
    """The MCP server with ddpify's four tools over the workspace `root`."""
    server = MCPServer("ddpify", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    tools = DdpifyTools(Workspace(root, allow_verify))
    reading = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
    for tool in (tools.convert, tools.lint, tools.explain):
        server.add_tool(tool, annotations=reading)
    server.add_tool(tools.verify, annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False))
    return server


def serve(root: str | os.PathLike, allow_verify: bool = False) -> None:
    """Serve one client over stdin/stdout, from the workspace root, until it closes the connection."""
    server = build_server(root, allow_verify)
    os.chdir(root)  # relative paths, the project's imports and verify's copy are the root's
    server.run("stdio")
