"""Convert a script's text to DDP or DataParallel: the one entry point for the CLI and verify."""

from __future__ import annotations

from ddpify.anatomy import ScriptKind, analyze
from ddpify.codemods.base import Options
from ddpify.codemods.pipeline import ConversionResult, run_pipeline

TARGETS = ("ddp", "dp")


def convert_source(text: str, target: str, *, path: str = "<string>", batch_size: str = "per-gpu") -> ConversionResult:
    """The converted text, the changes (original line numbers) and advice for the user."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    kind = analyze(text, path).kind
    reason = _nothing_to_do(kind, target)
    if reason:
        return ConversionResult(source=text, output=text, note=reason)
    return run_pipeline(text, path, _transforms(target), Options(batch_size=batch_size))


def _nothing_to_do(kind: ScriptKind, target: str) -> str:
    if kind is ScriptKind.NOT_TORCH:
        return "does not use torch"
    if kind.distributed:
        return "already distributed (DDP); nothing to do"
    if kind is ScriptKind.DATA_PARALLEL and target == "dp":
        return "already uses DataParallel; nothing to do"
    return ""


def _transforms(target: str):
    if target == "ddp":
        from ddpify.codemods.ddp import DDP_TRANSFORMS

        return DDP_TRANSFORMS
    from ddpify.codemods.dp import DP_TRANSFORMS

    return DP_TRANSFORMS
