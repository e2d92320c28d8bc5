"""Run `ddpify verify --to ddp` on every entry of the real-shaped corpus, converted completely or not.

For each entry (see bench/real_corpus.py): the outcome of `ddpify convert --to ddp` (converted,
incomplete with exit 3, ...), then verify's verdict on the same entry (verify converts it itself and
runs whatever the converter wrote, incomplete or not), its mode, and the largest per-step errors:
relative loss difference, max relative parameter difference, parameter error relative to the update.
Prints a markdown table (the figures of docs/verify-survey.md) and each entry's verdict line and notes.

    python bench/verify_survey.py [--json] [--only NAME ...] [--jobs N] [--steps K]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_corpus import VERIFY_TIMEOUT_S, convert, entries, over_entries, run  # noqa: E402

FIGURES = {"rel_loss": "max rel Δloss", "max_rel_param": "max rel Δparam", "update_rel_param": "max Δparam/update"}


@dataclass
class Verdict:
    name: str
    convert: str = ""
    convert_exit: int | None = None
    verdict: str = ""
    mode: str | None = None
    compared: int = 0  # optimizer steps compared (fewer than --steps when the script ends first)
    message: str = ""
    figures: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    seconds: float = 0.0


def largest(steps: list, key: str) -> float | None:
    """The largest value of one per-step column (None when no step has it)."""
    known = [row[key] for row in steps if row.get(key) is not None]
    return max(known) if known else None


def survey(entry, work: Path, steps: int) -> Verdict:
    """Convert one entry (to judge the converter's outcome), then verify it in a fresh copy."""
    row = Verdict(entry.name)
    conversion = convert(entry, entry.copy_to(work / "convert"), "ddp")
    row.convert, row.convert_exit = conversion.status, conversion.exit_code
    started = time.perf_counter()
    done = run([sys.executable, "-m", "ddpify", "verify", entry.script, "--to", "ddp", "--steps", str(steps), "--json"],
               entry.copy_to(work / "verify"), VERIFY_TIMEOUT_S)
    row.seconds = round(time.perf_counter() - started, 1)
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        row.verdict, row.message = "no verdict", (done.stderr.strip().splitlines() or ["no output"])[-1]
        return row
    row.verdict, row.mode, row.message = result["verdict"], result["mode"], result["message"]
    row.compared = len(result["steps"])
    row.figures = {key: largest(result["steps"], key) for key in FIGURES}
    row.notes = [note for note in result["notes"] if not note.startswith(("logs kept in", "converter advice"))]
    return row


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def table(rows: list) -> str:
    lines = ["| entry | convert (exit) | verdict | mode | steps | " + " | ".join(FIGURES.values()) + " |",
             "|---|---|---|---|---|" + "---|" * len(FIGURES)]
    for r in rows:
        figures = " | ".join(number(r.figures.get(key)) for key in FIGURES)
        lines.append(f"| `{r.name}` | {r.convert} ({r.convert_exit}) | {r.verdict} | {r.mode or '-'} | {r.compared} | {figures} |")
    return "\n".join(lines)


def totals(rows: list) -> dict:
    count = {}
    for r in rows:
        key = f"{r.convert}: {r.verdict}" + (f" ({r.mode})" if r.mode and r.verdict != "error" else "")
        count[key] = count.get(key, 0) + 1
    return {"entries": len(rows), **dict(sorted(count.items()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object (rows and totals)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="entries to verify (file stem or project folder)")
    parser.add_argument("--jobs", type=int, default=1, help="entries verified at once")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps verify compares (its --steps)")
    options = parser.parse_args()

    rows = over_entries(lambda entry, work: survey(entry, work, options.steps), entries(options.only), options.jobs,
                        lambda row: f"{row.convert}, {row.verdict}")
    if options.json:
        print(json.dumps({"rows": [asdict(r) for r in rows], "totals": totals(rows)}, indent=1))
        return
    print(table(rows))
    print()
    for r in rows:
        print(f"{r.name} ({r.seconds:g} s): {r.message}")
        print("".join(f"    note: {note}\n" for note in r.notes), end="")
    print()
    for name, value in totals(rows).items():
        print(f"{name:50} {value}")


if __name__ == "__main__":
    main()
