"""`ddpify mcp`: the Model Context Protocol server, driven through the mcp SDK's own client over stdio.

Each server is a real `python -m ddpify mcp --root <tmp>` process, one per module and kind (without
and with --allow-verify), its client's event loop run in a thread (an anyio blocking portal) so that
the tests stay plain functions. Every request is bounded by the client's read timeout; the SDK's
stdio client ends the process when its connection closes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify import __version__
from ddpify.cli import cli
from ddpify.commands.explain import explain_source
from ddpify.commands.mcp import MISSING_MCP
from ddpify.convert import TARGETS, convert_source
from ddpify.exit_codes import EXIT_ERROR
from ddpify.project_conversion import convert_entry
from test_outcome import NO_MODEL  # parameters trained by hand: no model to wrap, so incomplete

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
AGENTS_DOC = ROOT / "docs" / "agents.md"
CALL_TIMEOUT_S = 60.0  # any one request, the server's start-up included
VERIFY_TIMEOUT_S = 60  # the verify tool's own timeout for a run; the call waits a minute more (launcher slack)
# the SDK gives the server a minimal environment and these: the suite's bytecode folder too (tests/conftest.py), so that
# the servers reuse the bytecode the workers wrote instead of writing their own next to ddpify's sources
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       **{name: os.environ[name] for name in ("PYTHONPYCACHEPREFIX",) if name in os.environ}}

# a DDP script whose checkpoint every rank writes (DDP006, fixable on rank 0)
SAVES_ON_EVERY_RANK = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(2, 2))
torch.save(model.module.state_dict(), "model.pt")
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A workspace root with one training script, a symlink that leaves it, and a script beside it."""
    base = tmp_path_factory.mktemp("mcp")
    root = base / "root"
    root.mkdir()
    shutil.copy(FIXTURES / "basic_main.py", root / "train.py")
    shutil.copytree(FIXTURES / "projects" / "classic", root / "classic")  # an entry and the modules it imports
    outside = base / "outside.py"
    shutil.copy(FIXTURES / "basic_main.py", outside)
    (root / "escape.py").symlink_to(outside)
    return root


@pytest.fixture(scope="module")
def portal():
    # the SDK is imported by the tests that use it, not at collection, which every worker makes (mcp: 0.5 CPU-s)
    from anyio.from_thread import start_blocking_portal

    with start_blocking_portal() as portal:
        yield portal


@contextmanager
def connected(portal, command: str, args: list[str], cwd: Path, read_timeout: float = CALL_TIMEOUT_S):
    """A client of the server started by `command args` in `cwd`, initialized (the handshake agent clients use)."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=command, args=args, cwd=cwd, env=ENV)
    with portal.wrap_async_context_manager(Client(params, mode="legacy", read_timeout_seconds=read_timeout)) as client:
        yield client


@pytest.fixture(scope="module")
def client(portal, workspace):
    """The module's server (no --allow-verify), started from outside its root."""
    with connected(portal, sys.executable, ["-m", "ddpify", "mcp", "--root", str(workspace)], workspace.parent) as client:
        yield client


@pytest.fixture(scope="module")
def server(portal, client):
    """Call one of the module server's tools: server(tool, arguments) -> its result."""
    return lambda tool, arguments: portal.call(client.call_tool, tool, arguments)


def answer(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


def refusal(result) -> str:
    assert result.is_error, result.structured_content
    (content,) = result.content
    assert "Traceback" not in content.text
    return content.text


def test_initialize_names_ddpify_and_lists_the_four_tools(portal, client):
    assert (client.server_info.name, client.server_info.version) == ("ddpify", __version__)
    tools = {tool.name: tool for tool in portal.call(client.list_tools).tools}
    assert set(tools) == {"convert", "lint", "explain", "verify"}
    assert tools["convert"].input_schema["properties"]["target"]["enum"] == list(TARGETS)
    assert tools["convert"].annotations.read_only_hint and not tools["verify"].annotations.read_only_hint


def test_convert_a_path_gives_the_cli_conversion_and_its_diff(server, workspace):
    result = answer(server("convert", {"path": "train.py", "target": "ddp"}))
    expected = convert_source((workspace / "train.py").read_text(), "ddp", path="train.py")
    assert result["status"] == "converted" and result["output"] == expected.output
    assert result["diff"].startswith("--- a/train.py\n+++ b/train.py\n") and "+    model = DDP(" in result["diff"]
    assert {c["transform"] for c in result["changes"]} >= {"setup", "wrap", "sampler"} and result["modules"] == []
    assert (workspace / "train.py").read_text() == (FIXTURES / "basic_main.py").read_text()  # nothing written


def test_convert_a_project_entry_gives_its_modules_too(server, workspace):
    result = answer(server("convert", {"path": "classic/train.py"}))
    project = convert_entry(workspace / "classic" / "train.py", "ddp", {})
    expected = {job.path.relative_to(workspace).as_posix(): job.convert().output for job in project.jobs if job.changed and not job.entry}
    assert result["status"] == "converted" and set(expected) == {"classic/data.py", "classic/utils.py"}
    assert {module["path"]: module["output"] for module in result["modules"]} == expected
    assert all(module["diff"].startswith(f"--- a/{module['path']}\n") for module in result["modules"])


def test_convert_source_text_with_options(server, workspace):
    text = (workspace / "train.py").read_text()
    result = answer(server("convert", {"source": text, "target": "fsdp", "batch_size": "global"}))
    assert result["output"] == convert_source(text, "fsdp", path="<source>", batch_size="global").output
    assert result["target"] == "fsdp" and "fully_shard(" in result["output"]


def test_convert_says_incomplete_and_what_is_missing(server):
    result = answer(server("convert", {"source": NO_MODEL}))
    assert result["status"] == "incomplete" and result["missing"]
    assert all(item["line"] and item["what"] and item["todo"] for item in result["missing"])
    assert result["reason"].startswith(result["missing"][0]["what"])


def test_lint_gives_findings_as_json_and_the_fixed_source(server):
    found = answer(server("lint", {"source": SAVES_ON_EVERY_RANK}))
    (save,) = [f for f in found["findings"] if f["code"] == "DDP006"]
    assert save["line"] == 7 and save["fix"]["edits"] and not save["fix"]["safe"]
    assert "fixed_source" not in found
    fixed = answer(server("lint", {"source": SAVES_ON_EVERY_RANK, "fix": True, "unsafe_fixes": True}))
    assert fixed["fixes_applied"] >= 1 and "get_rank() == 0" in fixed["fixed_source"]
    again = answer(server("lint", {"source": fixed["fixed_source"]}))
    assert "DDP006" not in {f["code"] for f in again["findings"]}


def test_lint_select_and_a_typo_in_it(server):
    only = answer(server("lint", {"source": SAVES_ON_EVERY_RANK, "select": ["ddp006"]}))
    assert {f["code"] for f in only["findings"]} == {"DDP006"}
    assert "DDP99" in refusal(server("lint", {"source": SAVES_ON_EVERY_RANK, "select": ["DDP99"]}))


def test_explain_is_ddpify_explain(server, workspace):
    result = answer(server("explain", {"path": "train.py"}))
    expected = explain_source((workspace / "train.py").read_text(), "train.py", "ddp")
    report = result.pop("report")
    assert result == json.loads(json.dumps(expected))
    assert report.startswith("train.py: single-gpu script\n")


@pytest.mark.parametrize("tool", ["convert", "lint", "explain"])
@pytest.mark.parametrize("path, why", [("../outside.py", "'..' is refused"), ("escape.py", "outside the workspace root"),
                                        ("OUTSIDE", "outside the workspace root"), ("missing.py", "no such file")])
def test_paths_outside_the_root_are_refused(server, workspace, tool, path, why):
    path = str(workspace.parent / "outside.py") if path == "OUTSIDE" else path
    assert why in refusal(server(tool, {"path": path}))


def test_malformed_calls_get_errors_and_the_server_keeps_answering(server):
    assert "'ddp', 'dp', 'fsdp' or 'accelerate'" in refusal(server("convert", {"source": "x = 1\n", "target": "tpu"}))
    assert "exactly one of `source`" in refusal(server("convert", {}))
    assert "fsdp only" in refusal(server("convert", {"path": "train.py", "checkpoint": "sharded"}))
    assert "exactly one of `source`" in refusal(server("lint", {"source": "x = 1\n", "path": "train.py"}))
    assert re.search(r"<source>:1: .*syntax", refusal(server("explain", {"source": "def f(:\n"})), re.I)
    assert "Unknown tool" in refusal(server("compile", {}))
    assert answer(server("convert", {"path": "train.py"}))["status"] == "converted"


def test_verify_is_refused_without_allow_verify(server):
    assert "--allow-verify" in refusal(server("verify", {"path": "train.py"}))


def test_verify_with_allow_verify_runs_the_pair_inside_the_root_only(portal, workspace):
    args = ["-m", "ddpify", "mcp", "--root", str(workspace), "--allow-verify"]
    with connected(portal, sys.executable, args, workspace.parent, read_timeout=VERIFY_TIMEOUT_S + 60) as client:
        verify = lambda arguments: portal.call(client.call_tool, "verify", arguments)  # noqa: E731
        result = answer(verify({"path": "train.py", "steps": 2, "timeout": VERIFY_TIMEOUT_S}))
        assert result["verdict"] == "equivalent", result["message"]
        assert [row["step"] for row in result["steps"]] == [1, 2]
        assert "outside the workspace root" in refusal(verify({"path": "escape.py"}))
        assert "less than or equal to 600" in refusal(verify({"path": "train.py", "timeout": 10_000}))
    assert sorted(p.name for p in workspace.iterdir()) == ["classic", "escape.py", "train.py"]  # verify ran in a copy


def test_without_the_extra_mcp_says_how_to_install_it(monkeypatch):
    for name in [name for name in sys.modules if name.split(".")[0] in ("mcp", "mcp_types")] + ["mcp"]:
        monkeypatch.setitem(sys.modules, name, None)  # importing them then fails as if they were not installed
    monkeypatch.delitem(sys.modules, "ddpify.mcp_server", raising=False)
    result = CliRunner().invoke(cli, ["mcp"])
    assert result.exit_code == EXIT_ERROR
    assert result.output.strip() == MISSING_MCP and 'pip install "ddpify[mcp]"' in MISSING_MCP


# ----- docs/agents.md: the client configurations it gives start the server ---------------------
def documented_configs() -> list[tuple[str, dict]]:
    """(name, server entry) of every JSON block in docs/agents.md: `mcpServers` (Claude Code) or `servers` (VS Code)."""
    blocks = re.findall(r"```json\n(.*?)```", AGENTS_DOC.read_text(), re.S)
    return [(f"{key}:{name}", entry) for block in blocks for key, servers in json.loads(block).items()
            if key in ("mcpServers", "servers") for name, entry in servers.items()]


def documented_claude_add() -> list[str]:
    """The server command line of each `claude mcp add ... -- COMMAND` in docs/agents.md."""
    return [line.split(" -- ", 1)[1] for line in AGENTS_DOC.read_text().splitlines() if line.startswith("claude mcp add ")]


def test_the_doc_names_both_clients():
    keys = {name.split(":")[0] for name, _ in documented_configs()}
    assert keys == {"mcpServers", "servers"} and documented_claude_add()


def documented_command_lines() -> list:
    """Each distinct server command line docs/agents.md gives, named by the entries that give it (Claude Code's
    JSON and its `claude mcp add` give the same one: a server start costs 1.5 CPU-s)."""
    named: dict[tuple[str, ...], list[str]] = {}
    for name, entry in documented_configs():
        named.setdefault((entry["command"], *entry["args"]), []).append(name)
    for line in documented_claude_add():
        named.setdefault(tuple(shlex.split(line)), []).append("claude mcp add")
    return [pytest.param(list(command_line), id=" = ".join(names)) for command_line, names in named.items()]


@pytest.mark.parametrize("command_line", documented_command_lines())
def test_documented_command_lines_start_the_server(portal, workspace, command_line):
    command, *args = [arg.replace("${workspaceFolder}", str(workspace)) for arg in command_line]
    assert command == "ddpify" and shutil.which(command), "the doc's command is the installed console script"
    with connected(portal, command, args, cwd=workspace) as client:
        assert {tool.name for tool in portal.call(client.list_tools).tools} == {"convert", "lint", "explain", "verify"}
        assert answer(portal.call(client.call_tool, "explain", {"path": "train.py"}))["path"] == "train.py"
