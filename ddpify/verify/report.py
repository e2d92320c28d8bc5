"""Render a verdict dict as the text report: header, notes, per-step table, verdict line."""

from __future__ import annotations

from ddpify.verify.runner import Request

COLUMNS = ("step", "loss reference", "loss candidate", "rel Δloss", "max rel Δparam", "Δparam/update", "ranks agree")


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def step_lines(result: dict) -> list[str]:
    """The per-step table; the first diverging step is marked."""
    widths = [len(column) for column in COLUMNS]
    rows = [(str(row["step"]), _number(row["loss_reference"], ".6f"), _number(row["loss_candidate"], ".6f"),
             _number(row["rel_loss"], ".1e"), _number(row["max_rel_param"], ".1e"),
             _number(row.get("update_rel_param"), ".1e"), "yes" if row["ranks_agree"] else "NO") for row in result["steps"]]
    widths = [max(width, *(len(row[i]) for row in rows)) for i, width in enumerate(widths)]
    lines = ["  ".join(column.rjust(width) for column, width in zip(COLUMNS, widths))]
    for row, raw in zip(rows, result["steps"]):
        marker = "  <- diverged" if raw["step"] == result["diverged_at"] else ""
        lines.append("  ".join(cell.rjust(width) for cell, width in zip(row, widths)) + marker)
    return lines


def header(request: Request) -> str:
    """What was compared with what: the report's first line, and the plot's title."""
    candidate = request.against or f"{request.script} converted by ddpify"
    processes = f"{request.nproc} ranks" if request.target != "dp" else "1 process"
    return (f"verify {request.script} (1 process) against {candidate} ({request.target}, {processes}), "
            f"{request.steps} steps on {request.device}")


def render(request: Request, result: dict) -> str:
    """The whole text report, ending with the verdict line."""
    lines = [header(request)]
    lines += [f"note: {note}" for note in result["notes"]]
    if result["steps"]:
        lines += step_lines(result)
    lines += [f"precondition: {found}" for found in result["preconditions"]]
    for hang in result.get("hangs", []):
        lines += [f"{hang['process']} hung here (innermost first):", *(f"  {frame}" for frame in hang["frames"])]
    lines.append(result["message"])
    return "\n".join(lines)
