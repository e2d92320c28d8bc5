"""`verify --plot`: the verdict's per-step rows as a figure (matplotlib, an optional extra).

Top panel: the loss per step, reference and candidate. Bottom panel, on a log scale: the
parameter error per step as the comparison measures it, relative to how far training has
moved the parameters (Δparam/update) and elementwise (max rel Δparam), each with its
tolerance. matplotlib is imported only here, and only when --plot is given.
"""

from __future__ import annotations

import os

INSTALL_COMMAND = 'pip install "ddpify[plot]"'
ZERO_DRAWN_AT = 1e-12  # a log axis has no 0: exact agreement is drawn here
REFERENCE_COLOR, CANDIDATE_COLOR = "tab:blue", "tab:orange"
UPDATE_COLOR, ELEMENT_COLOR = "tab:green", "tab:purple"


def plot_problem(path: str) -> str | None:
    """Why `path` cannot be drawn (matplotlib missing, a format it lacks, no such folder), or None."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return f"--plot draws with matplotlib, which is not installed: {INSTALL_COMMAND}"
    formats = Figure().canvas.get_supported_filetypes()
    if _format(path) not in formats:
        return f"--plot cannot write .{_format(path)} files; use one of: {', '.join(sorted(formats))}"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"--plot: folder {folder} does not exist"
    return None


def write_plot(result: dict, path: str, title: str) -> None:
    """Draw the loss and parameter-error panels of `result` (a verdict with steps) into `path`, atomically."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 6.5), layout="constrained")
    loss_axes, error_axes = figure.subplots(2, 1, sharex=True)
    steps = [row["step"] for row in result["steps"]]
    draw_losses(loss_axes, steps, result["steps"])
    draw_parameter_errors(error_axes, steps, result["steps"], result.get("tolerances") or {})
    if result["diverged_at"] is not None:
        for axes in (loss_axes, error_axes):
            axes.axvline(result["diverged_at"], color="tab:red", linewidth=1, label=f"diverged at step {result['diverged_at']}")
    for axes in (loss_axes, error_axes):
        axes.legend(fontsize="small")
    error_axes.set_xlabel("optimizer step")
    error_axes.set_xticks(steps if len(steps) <= 20 else steps[:: len(steps) // 10])
    figure.suptitle(f"{title}\n{_verdict_line(result)}", fontsize="medium")
    save_atomically(figure, path)


def draw_losses(axes, steps: list[int], rows: list[dict]) -> None:
    """The reference's loss and the candidate's (mean over its ranks) per step."""
    axes.plot(steps, _gaps([row["loss_reference"] for row in rows]), color=REFERENCE_COLOR, marker="o",
              label="reference (1 process)")
    axes.plot(steps, _gaps([row["loss_candidate"] for row in rows]), color=CANDIDATE_COLOR, marker="x",
              linestyle="--", label="candidate")
    axes.set_ylabel("loss")


def draw_parameter_errors(axes, steps: list[int], rows: list[dict], tolerances: dict) -> None:
    """Δparam/update and max rel Δparam on a log axis, with the tolerances the verdict applied."""
    series = (("update_rel_param", "Δparam/update (L2 norms)", UPDATE_COLOR, "o"),
              ("max_rel_param", "max rel Δparam (elementwise)", ELEMENT_COLOR, "s"))
    zeros = False
    for key, label, color, marker in series:
        values = [row.get(key) for row in rows]
        if all(value is None for value in values):
            continue
        zeros = zeros or 0.0 in values
        axes.plot(steps, _gaps([None if v is None else max(v, ZERO_DRAWN_AT) for v in values]),
                  color=color, marker=marker, label=label)
        if tolerances.get(key) is not None:
            axes.axhline(tolerances[key], color=color, linestyle=":", linewidth=1, label=f"tolerance {tolerances[key]:g}")
    axes.set_yscale("log")
    axes.set_ylabel("parameter error" + (f" (0 drawn at {ZERO_DRAWN_AT:g})" if zeros else ""))
    checked = any(tolerances.get(key) is not None for key, *_ in series)
    axes.set_title("a step's parameters match when either error is within its tolerance (dotted)" if checked
                   else "statistical mode: parameters are held to no tolerance, only the ranks' agreement",
                   fontsize="small")


def save_atomically(figure, path: str) -> None:
    """Write the figure next to `path` under a temporary name, then rename it: readers never see half a file."""
    folder, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "xb") as f:
            figure.savefig(f, format=_format(path))
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _format(path: str) -> str:
    return os.path.splitext(path)[1].lstrip(".").lower() or "png"


def _gaps(values: list[float | None]) -> list[float]:
    """None (a step with no value) as NaN, which matplotlib leaves as a gap in the line."""
    return [float("nan") if value is None else value for value in values]


def _verdict_line(result: dict) -> str:
    mode = f", {result['mode']} mode" if result.get("mode") else ""
    if result["verdict"] == "diverged":
        return f"diverged at step {result['diverged_at']}{mode}"
    return f"{result['verdict']}{mode}"
