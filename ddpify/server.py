"""`ddpify server`: ddpify in an editor, as a Language Server (LSP over stdio). Needs pygls:
`pip install "ddpify[server]"`.

Nothing here lints, fixes or converts on its own: findings and fixes come from the lint engine
(`lint_text`, what `ddpify lint` and `ddpify lint --fix` run) with [tool.ddpify] from the nearest
pyproject.toml, hovers from the rule docs (`ddpify rule CODE`), the conversion from `convert_source`.
ddpify's positions (1-based lines, code-point columns) are turned into the client's units here.
"""

from __future__ import annotations

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer
from pygls.workspace import TextDocument
from pygls.workspace.position_codec import ServerTextPosition, ServerTextRange

from ddpify import __version__
from ddpify.anatomy import Pos
from ddpify.codemods.pipeline import ConversionResult, Status
from ddpify.convert import convert_source
from ddpify.lint.config import ConfigError, config_for
from ddpify.lint.docs import reference_link, render_rule
from ddpify.lint.engine import NOTEBOOK_SUFFIX, Diagnostic, Options, lint_text
from ddpify.lint.registry import all_rules, rule_by_code
from ddpify.lint.rule import Edit, Fix

CONVERT_COMMAND = "ddpify.convertToDDP"
FIX_ALL_KIND = f"{lsp.CodeActionKind.SourceFixAll.value}.ddpify"
_SEVERITY = {"error": lsp.DiagnosticSeverity.Error, "warning": lsp.DiagnosticSeverity.Warning,
             "info": lsp.DiagnosticSeverity.Information}


class DdpifyServer(LanguageServer):
    """The language server; `unsafe_fixes` offers unsafe fixes too (`ddpify server --unsafe-fixes`)."""

    def __init__(self) -> None:
        super().__init__("ddpify", __version__)
        self.unsafe_fixes = False
        self.shown_errors: set[str] = set()  # config errors already shown: not again on every keystroke

    def lint(self, doc: TextDocument, fix: bool = False) -> tuple[list[Diagnostic], str]:
        """The findings in the document's current text, as `ddpify lint` reports them for its file,
        and the text after the wanted fixes (`fix`: what `ddpify lint --fix` would write). A config
        error is shown, a text that does not parse (yet) is logged: both give no findings."""
        path = doc.path or doc.uri
        if path.endswith(NOTEBOOK_SUFFIX):  # notebooks are linted from disk by the CLI only
            return [], doc.source
        try:
            config = config_for(path)
            config.validate(all_rules())
        except ConfigError as e:
            self.show_once(f"ddpify: {e}")
            return [], doc.source
        report, fixed = lint_text(doc.source, path, Options(config=config, fix=fix, unsafe_fixes=self.unsafe_fixes))
        for error in report.errors:
            self.window_log_message(lsp.LogMessageParams(lsp.MessageType.Warning, error))
        return report.diagnostics, fixed

    def wants(self, fix: Fix | None) -> bool:
        """Is this fix offered: a safe one, or an unsafe one with --unsafe-fixes?"""
        return Options(unsafe_fixes=self.unsafe_fixes).wants(fix)

    def show_once(self, message: str) -> None:
        if message not in self.shown_errors:
            self.shown_errors.add(message)
            self.window_show_message(lsp.ShowMessageParams(lsp.MessageType.Error, message))


server = DdpifyServer()


# ----- positions --------------------------------------------------------------------------------
def server_range(span: Pos | Edit) -> ServerTextRange:
    """A ddpify range (1-based lines, code-point columns) as pygls's code-point range (0-based lines)."""
    return ServerTextRange(ServerTextPosition(span.line - 1, span.col), ServerTextPosition(span.end_line - 1, span.end_col))


def client_range(doc: TextDocument, span: Pos | Edit) -> lsp.Range:
    """A ddpify range in the client's position encoding (UTF-16 unless it chose another)."""
    return doc.range_to_client_units(server_range(span))


def whole_document(doc: TextDocument) -> lsp.Range:
    """The range of the entire text (a final newline opens an empty last line, as LSP counts lines)."""
    lines = doc.lines
    if not lines or lines[-1].endswith(("\n", "\r")):
        return lsp.Range(lsp.Position(0, 0), lsp.Position(len(lines), 0))
    return lsp.Range(lsp.Position(0, 0), doc.position_to_client_units(ServerTextPosition(len(lines) - 1, len(lines[-1]))))


def replace_document(doc: TextDocument, text: str) -> lsp.WorkspaceEdit:
    return lsp.WorkspaceEdit(changes={doc.uri: [lsp.TextEdit(whole_document(doc), text)]})


# ----- diagnostics ------------------------------------------------------------------------------
def lsp_diagnostic(doc: TextDocument, d: Diagnostic) -> lsp.Diagnostic:
    """A finding as an LSP diagnostic: range, severity, rule code and a link to the rule's docs."""
    rule = rule_by_code(d.code)
    link = reference_link(rule) if rule is not None else None
    return lsp.Diagnostic(
        range=client_range(doc, d.pos),
        message=d.message,
        severity=_SEVERITY.get(d.severity, lsp.DiagnosticSeverity.Error),
        code=d.code,
        code_description=lsp.CodeDescription(href=link) if link else None,
        source="ddpify",
    )


@server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
@server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
@server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
def publish_findings(ls: DdpifyServer, params) -> None:
    """Lint the document as it now is and publish the findings."""
    doc = ls.workspace.get_text_document(params.text_document.uri)
    findings, _ = ls.lint(doc)
    diagnostics = [lsp_diagnostic(doc, d) for d in findings]
    ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(doc.uri, diagnostics, version=doc.version))


@server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
def clear_findings(ls: DdpifyServer, params: lsp.DidCloseTextDocumentParams) -> None:
    ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(params.text_document.uri, []))


# ----- code actions -----------------------------------------------------------------------------
@server.feature(lsp.TEXT_DOCUMENT_CODE_ACTION,
                lsp.CodeActionOptions(code_action_kinds=[lsp.CodeActionKind.QuickFix, FIX_ALL_KIND]))
def code_actions(ls: DdpifyServer, params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
    """A quick fix for each fixable finding in the range, and "fix all" (what `ddpify lint --fix` does)."""
    doc = ls.workspace.get_text_document(params.text_document.uri)
    findings, _ = ls.lint(doc)
    fixable = [d for d in findings if ls.wants(d.fix)]
    asked = doc.range_from_client_units(params.range)
    actions = [quick_fix(doc, d) for d in fixable if server_range(d.pos).overlaps(asked)]
    if fixable:
        _, fixed = ls.lint(doc, fix=True)
        if fixed != doc.source:
            actions.append(lsp.CodeAction("ddpify: fix all auto-fixable findings", kind=FIX_ALL_KIND,
                                          edit=replace_document(doc, fixed)))
    only = params.context.only
    return [a for a in actions if not only or any(a.kind.startswith(kind) for kind in only)]


def quick_fix(doc: TextDocument, d: Diagnostic) -> lsp.CodeAction:
    """The finding's own fix (callers pass fixable findings only), its edits applied together."""
    fix: Fix = d.fix  # type: ignore[assignment]
    edits = [lsp.TextEdit(client_range(doc, e), e.text) for e in fix.edits]
    return lsp.CodeAction(
        f"{d.code}: {fix.description}" + ("" if fix.safe else " (unsafe)"),
        kind=lsp.CodeActionKind.QuickFix,
        diagnostics=[lsp_diagnostic(doc, d)],
        edit=lsp.WorkspaceEdit(changes={doc.uri: edits}),
        is_preferred=fix.safe,
    )


# ----- hover ------------------------------------------------------------------------------------
@server.feature(lsp.TEXT_DOCUMENT_HOVER)
def hover(ls: DdpifyServer, params: lsp.HoverParams) -> lsp.Hover | None:
    """The docs of the rules whose findings cover the position (`ddpify rule CODE`)."""
    doc = ls.workspace.get_text_document(params.text_document.uri)
    here = doc.position_from_client_units(params.position)
    findings = [d for d in ls.lint(doc)[0] if here in server_range(d.pos)]
    rules = [rule_by_code(code) for code in dict.fromkeys(d.code for d in findings)]
    docs = [render_rule(rule) for rule in rules if rule is not None]
    if not docs:
        return None
    return lsp.Hover(lsp.MarkupContent(lsp.MarkupKind.Markdown, "\n---\n\n".join(docs)), client_range(doc, findings[0].pos))


# ----- conversion -------------------------------------------------------------------------------
@server.command(CONVERT_COMMAND)
async def convert_to_ddp(ls: DdpifyServer, uri: str) -> dict:
    """Replace the document with its DDP conversion (`ddpify convert --to ddp`) through
    workspace/applyEdit, and say how it ended: an incomplete one lists what is left to do by hand.
    Returns the status, whether the editor applied the edit, and the missing items."""
    doc = ls.workspace.get_text_document(uri)
    try:
        result = convert_source(doc.source, "ddp", path=doc.path or doc.uri)
    except Exception as e:  # e.g. a text that does not parse: say so rather than answer with a bare RPC error
        ls.window_show_message(lsp.ShowMessageParams(lsp.MessageType.Error, f"ddpify: conversion to DDP failed: {e}"))
        return {"status": "failed", "applied": False, "missing": []}
    applied = False
    if result.changed:
        edit = lsp.ApplyWorkspaceEditParams(replace_document(doc, result.output), label="ddpify: convert to DDP")
        applied = (await ls.workspace_apply_edit_async(edit)).applied
    ls.window_show_message(conversion_message(result, applied))
    return {"status": result.status.value, "applied": applied, "missing": [str(m) for m in result.missing]}


def conversion_message(result: ConversionResult, applied: bool) -> lsp.ShowMessageParams:
    """What the user is told: nothing to do (why), not applied, incomplete (every missing item), or done."""
    if result.status is Status.NOTHING_TO_DO:
        return lsp.ShowMessageParams(lsp.MessageType.Info, f"ddpify: nothing to convert: {result.reason}")
    if result.changed and not applied:
        return lsp.ShowMessageParams(lsp.MessageType.Warning, "ddpify: the editor did not apply the conversion to DDP")
    if result.status is Status.INCOMPLETE:
        items = "\n".join(f"- {m}" for m in result.missing)
        return lsp.ShowMessageParams(lsp.MessageType.Warning, f"ddpify: the conversion to DDP is incomplete; "
                                     f"{len(result.missing)} item(s) to do by hand:\n{items}")
    return lsp.ShowMessageParams(lsp.MessageType.Info, f"ddpify: converted to DDP ({result.reason})")


def serve(unsafe_fixes: bool = False) -> None:
    """Serve one client over stdin/stdout until it says exit."""
    server.unsafe_fixes = unsafe_fixes
    server.start_io()
