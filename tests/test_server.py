"""`ddpify server` end to end: a real LSP client (pygls's) starts `python -m ddpify server` over
stdio, opens files, and checks the diagnostics, code actions, hover and the DDP conversion it gets
back; then shuts the server down. One session serves every test (each waits at most TIMEOUT)."""

from __future__ import annotations

import asyncio
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.cli import cli
from ddpify.commands.server import MISSING_PYGLS

pytest.importorskip("pygls")
from lsprotocol import types as lsp  # noqa: E402
from pygls.lsp.client import LanguageClient  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 20.0
SAVE_LINE = '        torch.save(model.state_dict(), "ckpt-😀.pt")'  # the emoji is 2 UTF-16 units: ranges must count them
BUGGY_DDP = f'''import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    dataset = TensorDataset(torch.ones(64, 4), torch.ones(64, 1))  # alike on every rank (DDP023)
    loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
{SAVE_LINE}
    dist.destroy_process_group()
'''
# DDP003 (sampler-without-set-epoch, safe fix) on `for epoch` (line 13), DDP006 (save-on-every-rank,
# unsafe fix) on the torch.save (line 18); DDP008 there too, but the pyproject.toml ignores it.
SET_EPOCH = lsp.Range(lsp.Position(12, 4), lsp.Position(12, 25))
SAVE = lsp.Range(lsp.Position(17, 8), lsp.Position(17, len(SAVE_LINE.encode("utf-16-le")) // 2))


@dataclass
class Session:
    """What the client saw during the session."""

    diagnostics: list[lsp.Diagnostic] = field(default_factory=list)
    quick_fixes_at_set_epoch: list[lsp.CodeAction] = field(default_factory=list)
    actions_at_save: list[lsp.CodeAction] = field(default_factory=list)
    hover: lsp.Hover | None = None
    after_fix: list[lsp.Diagnostic] = field(default_factory=list)  # after applying DDP003's fix, saved
    converted: dict = field(default_factory=dict)  # file name: (command result, applied text, message)
    exit_code: int | None = None


class Client(LanguageClient):
    """pygls's client, recording what the server pushes: diagnostics, messages and edits to apply."""

    def __init__(self) -> None:
        super().__init__("ddpify-test", "1")
        self.published: dict[str, asyncio.Queue] = {}
        self.messages: asyncio.Queue = asyncio.Queue()
        self.edits: asyncio.Queue = asyncio.Queue()
        self.feature(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)(_record_diagnostics)
        self.feature(lsp.WINDOW_SHOW_MESSAGE)(_record_message)
        self.feature(lsp.WORKSPACE_APPLY_EDIT)(_record_edit)

    async def diagnostics(self, uri: str) -> list[lsp.Diagnostic]:
        """The next diagnostics published for `uri`."""
        return await asyncio.wait_for(self.published.setdefault(uri, asyncio.Queue()).get(), TIMEOUT)

    async def open(self, path: Path) -> list[lsp.Diagnostic]:
        """didOpen the file, and the diagnostics published for it."""
        item = lsp.TextDocumentItem(uri=path.as_uri(), language_id="python", version=1, text=path.read_text())
        self.text_document_did_open(lsp.DidOpenTextDocumentParams(item))
        return await self.diagnostics(item.uri)

    async def edit(self, path: Path, edit: lsp.TextEdit, version: int) -> list[lsp.Diagnostic]:
        """didChange (incremental) then didSave the file; the diagnostics published after each."""
        document = lsp.VersionedTextDocumentIdentifier(version, path.as_uri())
        change = lsp.TextDocumentContentChangePartial(edit.range, edit.new_text)
        self.text_document_did_change(lsp.DidChangeTextDocumentParams(document, [change]))
        after_change = await self.diagnostics(document.uri)
        self.text_document_did_save(lsp.DidSaveTextDocumentParams(lsp.TextDocumentIdentifier(document.uri)))
        assert await self.diagnostics(document.uri) == after_change
        return after_change

    async def actions(self, path: Path, at: lsp.Range) -> list[lsp.CodeAction]:
        params = lsp.CodeActionParams(lsp.TextDocumentIdentifier(path.as_uri()), at, lsp.CodeActionContext(diagnostics=[]))
        return await asyncio.wait_for(self.text_document_code_action_async(params), TIMEOUT) or []


def _record_diagnostics(ls: Client, params: lsp.PublishDiagnosticsParams) -> None:
    ls.published.setdefault(params.uri, asyncio.Queue()).put_nowait(params.diagnostics)


def _record_message(ls: Client, params: lsp.ShowMessageParams) -> None:
    ls.messages.put_nowait(params)


def _record_edit(ls: Client, params: lsp.ApplyWorkspaceEditParams) -> lsp.ApplyWorkspaceEditResult:
    ls.edits.put_nowait(params.edit)
    return lsp.ApplyWorkspaceEditResult(applied=True)


@asynccontextmanager
async def serving(folder: Path, *options: str):
    """A client talking to `python -m ddpify server OPTIONS` over stdio, initialized on `folder`;
    the server is killed if it has not exited when the block ends."""
    client = Client()
    await client.start_io(sys.executable, "-m", "ddpify", "server", *options, cwd=str(ROOT))
    try:
        init = lsp.InitializeParams(capabilities=lsp.ClientCapabilities(), root_uri=folder.as_uri())
        await asyncio.wait_for(client.initialize_async(init), TIMEOUT)
        client.initialized(lsp.InitializedParams())
        yield client
    finally:
        if client._server is not None and client._server.returncode is None:
            client._server.kill()
            await client._server.wait()


async def shut_down(client: Client) -> int:
    """shutdown, exit; the server's exit status."""
    await asyncio.wait_for(client.shutdown_async(None), TIMEOUT)
    client.exit(None)
    code = await asyncio.wait_for(client._server.wait(), TIMEOUT)
    await asyncio.wait_for(client.stop(), TIMEOUT)
    return code


CONVERTED = {"basic_main.py": "basic_main.py", "weighted_sampler.py": "real/weighted_sampler.py"}  # converts; incomplete


async def run_session(folder: Path) -> Session:
    seen = Session()
    buggy = folder / "buggy_ddp.py"
    async with serving(folder) as client:
        seen.diagnostics = await client.open(buggy)
        seen.quick_fixes_at_set_epoch = [a for a in await client.actions(buggy, SET_EPOCH) if a.kind == lsp.CodeActionKind.QuickFix]
        seen.actions_at_save = await client.actions(buggy, SAVE)
        seen.hover = await asyncio.wait_for(client.text_document_hover_async(
            lsp.HoverParams(lsp.TextDocumentIdentifier(buggy.as_uri()), lsp.Position(12, 10))), TIMEOUT)
        [fix] = seen.quick_fixes_at_set_epoch[0].edit.changes[buggy.as_uri()]
        seen.after_fix = await client.edit(buggy, fix, version=2)
        for name in CONVERTED:
            script = folder / name
            await client.open(script)
            result = await asyncio.wait_for(client.workspace_execute_command_async(lsp.ExecuteCommandParams(
                "ddpify.convertToDDP", [script.as_uri()])), TIMEOUT)
            edit = await asyncio.wait_for(client.edits.get(), TIMEOUT)
            message = await asyncio.wait_for(client.messages.get(), TIMEOUT)
            seen.converted[name] = (result, edit.changes[script.as_uri()][0].new_text, message)
        seen.exit_code = await shut_down(client)
    return seen


async def unsafe_fix_actions(folder: Path) -> list[lsp.CodeAction]:
    """The code actions at the torch.save from a server started with --unsafe-fixes."""
    async with serving(folder, "--unsafe-fixes") as client:
        await client.open(folder / "buggy_ddp.py")
        actions = await client.actions(folder / "buggy_ddp.py", SAVE)
        await shut_down(client)
    return actions


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A workspace: a pyproject.toml that ignores DDP008, the buggy DDP script and two single-GPU fixtures."""
    folder = tmp_path_factory.mktemp("workspace")
    (folder / "pyproject.toml").write_text('[tool.ddpify]\nignore = ["DDP008"]\n')
    (folder / "buggy_ddp.py").write_text(BUGGY_DDP, encoding="utf-8")
    for name, source in CONVERTED.items():
        (folder / name).write_text((ROOT / "fixtures" / source).read_text())
    return folder


@pytest.fixture(scope="module")
def session(folder) -> Session:
    return asyncio.run(asyncio.wait_for(run_session(folder), 4 * TIMEOUT))


def test_diagnostics_carry_code_severity_range_and_docs_link_and_follow_the_config(session):
    found = {d.code: d for d in session.diagnostics}
    assert sorted(found) == ["DDP003", "DDP006"]  # DDP008 is ignored by [tool.ddpify]
    assert found["DDP003"].range == SET_EPOCH and found["DDP003"].severity == lsp.DiagnosticSeverity.Warning
    assert found["DDP006"].range == SAVE and found["DDP006"].severity == lsp.DiagnosticSeverity.Error
    assert all(d.source == "ddpify" for d in session.diagnostics)
    assert found["DDP003"].code_description.href.endswith("docs/rules.md#ddp003-sampler-without-set-epoch")


def test_code_action_offers_the_safe_fix_of_the_finding(session):
    [action] = session.quick_fixes_at_set_epoch
    assert action.title.startswith("DDP003: ") and action.is_preferred
    [(uri, [edit])] = action.edit.changes.items()
    assert uri.endswith("buggy_ddp.py")
    assert edit.range == lsp.Range(lsp.Position(13, 0), lsp.Position(13, 0))
    assert edit.new_text == "        loader.sampler.set_epoch(epoch)\n"


def test_unsafe_fix_is_not_offered_without_unsafe_fixes_but_fix_all_is(session):
    kinds = [a.kind for a in session.actions_at_save]
    assert kinds == ["source.fixAll.ddpify"]  # DDP006's fix is unsafe
    [fixed] = session.actions_at_save[0].edit.changes.values()
    assert "loader.sampler.set_epoch(epoch)" in fixed[0].new_text and "get_rank" not in fixed[0].new_text


def test_unsafe_fix_is_offered_with_unsafe_fixes(folder):
    actions = asyncio.run(asyncio.wait_for(unsafe_fix_actions(folder), 3 * TIMEOUT))
    [fix] = [a for a in actions if a.kind == lsp.CodeActionKind.QuickFix]
    assert fix.title.startswith("DDP006: ") and fix.title.endswith("(unsafe)") and not fix.is_preferred
    [edit] = fix.edit.changes[(folder / "buggy_ddp.py").as_uri()]
    assert edit.new_text.startswith("        if dist.get_rank() == 0:\n")


def test_edits_republish_diagnostics(session):
    assert [d.code for d in session.after_fix] == ["DDP006"]  # the quick fix, applied, cleared DDP003
    assert session.after_fix[0].range.start.line == SAVE.start.line + 1  # a line was inserted above


def test_hover_shows_the_rule_docs(session):
    text = session.hover.contents.value
    assert text.startswith("## DDP003: sampler-without-set-epoch")
    assert "### Why is this bad?" in text


def test_convert_command_applies_the_ddp_conversion(session):
    result, text, message = session.converted["basic_main.py"]
    assert result == {"status": "converted", "applied": True, "missing": []}
    assert "DistributedDataParallel" in text
    assert message.type == lsp.MessageType.Info and "converted to DDP" in message.message


def test_convert_command_reports_an_incomplete_conversion_with_its_missing_items(session):
    result, text, message = session.converted["weighted_sampler.py"]
    assert result["status"] == "incomplete" and result["missing"]
    assert message.type == lsp.MessageType.Warning and "incomplete" in message.message
    assert "training loader not sharded" in message.message


def test_server_exits_cleanly_after_shutdown(session):
    assert session.exit_code == 0


def test_server_without_pygls_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pygls", None)  # `import pygls` then fails as if it were not installed
    monkeypatch.delitem(sys.modules, "ddpify.server", raising=False)
    result = CliRunner().invoke(cli, ["server"])
    assert result.exit_code == 2
    assert result.output.strip() == MISSING_PYGLS and 'pip install "ddpify[server]"' in MISSING_PYGLS
