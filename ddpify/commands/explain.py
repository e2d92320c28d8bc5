"""`ddpify explain PATH`: what ddpify sees in a training script, and what `--to ddp` would change.

Static, like every command but `verify`: the script is parsed, never imported or executed.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ddpify.exit_codes import EXIT_ERROR, EXIT_OK
from ddpify.sources import Source, SourceError, check_syntax, read_source

if TYPE_CHECKING:
    from ddpify.codemods.pipeline import ConversionResult


def _side_effects(a) -> dict[str, list[int]]:
    """The lines of the side effects a multi-GPU run has to care about, judged as convert and lint
    judge output (ddpify.anatomy.output)."""
    from ddpify.anatomy.output import WANDB_CALL, WRITER, WRITER_CALL, log_level, output_kind, rank_zero_object
    from ddpify.anatomy.vocabulary import PRINT, TORCH_LOAD, TORCH_SAVE

    effects: dict[str, set[int]] = {"print": set(), "logging": set(), "tensorboard": set(), "save": set(), "load": set()}
    for call in a.calls:
        kind = output_kind(a, call.node)
        found = {
            "print": kind == PRINT,
            "logging": log_level(a, call.node) is not None,
            "tensorboard": kind in (WANDB_CALL, WRITER_CALL) or rank_zero_object(a, call.node) == WRITER,
            "save": kind == TORCH_SAVE,
            "load": call.qualname == TORCH_LOAD,
        }
        for name in (name for name, yes in found.items() if yes):
            effects[name].add(call.line)
    return {name: sorted(lines) for name, lines in effects.items()}


def explain_source(text: str, path: str = "<string>", target: str = "ddp") -> dict:
    """The anatomy of `text` as plain data (JSON-ready), plus the changes `--to target` would make."""
    from ddpify.anatomy import ROLE_OPTIMIZER, analyze
    from ddpify.anatomy.vocabulary import is_optimizer_constructor
    from ddpify.convert import convert_source

    a = analyze(text, path)
    models = []
    seen = set()
    for site in list(a.models) + list(a.trained_models):
        key = (site.target, site.line) if site.target else id(site)
        if key in seen:
            continue
        seen.add(key)
        cls = site.class_name
        bn = site.has_batchnorm
        if bn is None and cls in a.model_classes:
            bn = a.model_classes[cls].has_batchnorm
        models.append({
            "variable": site.target.name if site.target else None,
            "scope": site.scope,
            "class": cls or None,
            "line": site.line,
            "placements": sorted({p.lineno for p in site.placements}),
            "batchnorm": bn,
            "trained": any(site.target == t.target for t in a.trained_models),
        })
    optimizers = [
        {"class": c.qualname, "line": c.line}
        for c in a.calls
        if is_optimizer_constructor(c.qualname)
    ]
    loaders = [
        {"variable": ld.target.name if ld.target else None, "line": ld.line, "role": "train" if ld.is_train else "eval"}
        for ld in a.loaders
    ]

    def loop(lp):
        return {"line": lp.line, "loop_var": lp.loop_var, "loader_line": lp.loader.line if lp.loader else None, "trains": lp.trains}

    def lines(calls) -> list[int]:
        return sorted({c.line for c in calls})

    effects = _side_effects(a)
    backward = lines(c for c in a.calls if c.qualname.endswith(".backward") or c.qualname == "torch.autograd.backward")
    steps = lines(a.calls_on(ROLE_OPTIMIZER, "step"))
    try:
        conversion = conversion_data(convert_source(text, target, path=path), target)
    except Exception as error:  # explain must still report the anatomy when a codemod fails
        conversion = {"target": target, "status": "failed", "note": f"conversion failed ({type(error).__name__}: {error})",
                      "changes": [], "advice": [], "missing": []}
    guard = a.main_guard
    return {
        "path": path,
        "kind": a.kind.value,
        "entry": {"function": a.entry, "main_guard_line": guard.lineno if isinstance(guard, ast.AST) else None},
        "model_classes": {name: {"line": mc.node.lineno, "batchnorm": mc.has_batchnorm} for name, mc in a.model_classes.items()},
        "models": models,
        "optimizers": optimizers,
        "loaders": loaders,
        "epoch_loops": [loop(lp) for lp in a.epoch_loops],
        "step_loops": [loop(lp) for lp in a.step_loops],
        "backward": backward,
        "optimizer_step": steps,
        "side_effects": effects,
        "conversion": conversion,
    }


def _at(lines: list[int]) -> str:
    if not lines:
        return "none"
    return f"{len(lines)} (line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))})"


def conversion_data(result: ConversionResult, target: str) -> dict:
    """A conversion's outcome as plain data (JSON-ready): status, why nothing was done, and the
    changes, advice and missing items with their original lines."""
    return {
        "target": target,
        "status": result.status.value,
        "note": result.note,
        "changes": [{"line": c.line, "transform": c.transform, "message": c.message} for c in result.changes],
        "advice": [{"line": w.line, "message": w.message} for w in result.advice],
        "missing": [{"line": m.line, "what": m.what, "todo": m.todo} for m in result.missing],
    }


def render_text(info: dict) -> str:
    """A short human-readable report of `explain_source`'s data."""
    out = [f"{info['path']}: {info['kind']} script"]
    entry = info["entry"]
    if entry["function"] or entry["main_guard_line"]:
        where = f"{entry['function']}()" if entry["function"] else "module code"
        guard = f" under `if __name__ == \"__main__\"` (line {entry['main_guard_line']})" if entry["main_guard_line"] else ""
        out.append(f"entry point: {where}{guard}")
    else:
        out.append("entry point: top-level module code (no __main__ guard)")
    out.append("models:")
    for m in info["models"] or []:
        bits = [f"line {m['line']}"]
        if m["class"]:
            bits.append(f"class {m['class']}")
        if m["placements"]:
            bits.append("moved to device at line " + ", ".join(map(str, m["placements"])))
        if m["batchnorm"]:
            bits.append("has BatchNorm")
        if m["trained"]:
            bits.append("trained")
        out.append(f"  {m['variable'] or '?'}: " + "; ".join(bits))
    if not info["models"]:
        out.append("  none found")
    if info["model_classes"]:
        out.append("model classes: " + ", ".join(
            f"{n} (line {c['line']}{', BatchNorm' if c['batchnorm'] else ''})" for n, c in info["model_classes"].items()))
    out.append("optimizers: " + (", ".join(f"{o['class']} (line {o['line']})" for o in info["optimizers"]) or "none"))
    out.append("loaders:")
    for ld in info["loaders"]:
        out.append(f"  {ld['variable'] or '?'}: {ld['role']}, line {ld['line']}")
    if not info["loaders"]:
        out.append("  none found")
    for key, label in (("epoch_loops", "epoch loops"), ("step_loops", "step loops")):
        loops = info[key]
        out.append(f"{label}: " + (", ".join(f"line {lp['line']} (for {lp['loop_var'] or '?'})" for lp in loops) or "none"))
    out.append(f"backward calls: {_at(info['backward'])}")
    out.append(f"optimizer steps: {_at(info['optimizer_step'])}")
    for name, lines in info["side_effects"].items():
        out.append(f"{name}: {_at(lines)}")
    conv = info["conversion"]
    out.append(f"--to {conv['target']} would:")
    if conv["note"]:
        out.append(f"  do nothing: {conv['note']}")
    for c in conv["changes"]:
        out.append(f"  line {c['line']}: [{c['transform']}] {c['message']}")
    if not conv["note"] and not conv["changes"]:
        out.append("  change nothing")
    for w in conv["advice"]:
        out.append(f"  warning, line {w['line']}: {w['message']}")
    for m in conv["missing"]:
        out.append(f"  missing, line {m['line']}: {m['what']}; {m['todo']}")
    out.append(f"  and end {conv['status']}")
    return "\n".join(out) + "\n"


@click.command()
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False, readable=False))
@click.option("--to", "target", type=click.Choice(["ddp", "dp"]), default="ddp", show_default=True,
              help="Which conversion to preview.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def explain(path, target, as_json):
    """Explain what ddpify finds in a training script (never runs it) and what a conversion would change."""
    try:
        text = _script_text(path)
    except SourceError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(EXIT_ERROR)
    info = explain_source(text, str(path), target)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(render_text(info), nl=False)
    sys.exit(EXIT_OK)


def _script_text(path: Path) -> str:
    """The script to explain: the file, or a notebook's code cells joined (lines are the joined script's)."""
    if path.suffix == ".ipynb":
        from ddpify.notebooks import read_notebook_script

        text = read_notebook_script(path)[0]
        check_syntax(Source(path=str(path), text=text, encoding="utf-8", bom=False, mode=None))
        return text
    source = read_source(path)
    check_syntax(source)
    return source.text


COMMANDS = (explain,)
