"""Seconds to convert a corpus of varied scripts, against a bare LibCST parse + codegen of the same files.

    python bench/bench_convert.py [--to ddp dp fsdp] [--rounds 3] [--breakdown]

The corpus is every script the tests convert: fixtures/*.py, fixtures/real/*.py and the modules of
the projects in fixtures/real/*_project/ and fixtures/projects/ (each converted on its own, without
its project's facts). For each target it prints the seconds of `libcst.parse_module(text).code`
over the corpus, of `convert_source(text, target)`, their ratio, and files/s, each the best of
`--rounds` interleaved rounds; `--breakdown` then profiles one more conversion of the corpus and
prints where its time goes (under the profiler, whose overhead inflates LibCST's many small calls).

Figures (101 files, 5,264 lines; 2 CPU cores shared with other work: expect noise of ~20% and
compare only figures taken back to back):

    back to back at 17:06 UTC, 1494d43 (before) then 65977ad (after):
      before --to ddp : parse+codegen 0.45 s, convert 35.20 s, ratio 79.0x,  2.9 files/s
      before --to dp  : parse+codegen 0.45 s, convert 11.11 s, ratio 24.9x,  9.1 files/s
      before --to fsdp: parse+codegen 0.45 s, convert 30.88 s, ratio 69.3x,  3.3 files/s
      after  --to ddp : parse+codegen 0.47 s, convert 11.05 s, ratio 23.6x,  9.1 files/s
      after  --to dp  : parse+codegen 0.47 s, convert  3.28 s, ratio  7.0x, 30.7 files/s
      after  --to fsdp: parse+codegen 0.47 s, convert  9.71 s, ratio 20.8x, 10.4 files/s
    before, ddp profile: analyze 29% (1235 calls, ~12 per file), CST passes 47% (1053 calls).
    after, ddp profile (--breakdown): analyze 33% (416 calls, ~4 per converted file with the lint's),
      CST passes 32% (234 calls, ~3 per converted file; nearly all of it LibCST's position metadata),
      codegen 11%, imports added (AddImportsVisitor) 12%, lint of the output 11%.

    back to back at 17:43 UTC, 5f75159 (main) then 04c466d (edit passes locate statements by the ast
    and expressions by their statement's own positions; imports inserted directly; one ast.walk per
    analysis), two rounds each:
      before --to ddp : parse+codegen 0.47-0.55 s, convert 10.58-11.52 s, ratio 21.0-22.4x, 8.8-9.5 files/s
      before --to dp  : parse+codegen 0.47-0.55 s, convert  3.02-3.25 s,  ratio  5.9-6.4x, 31-34 files/s
      before --to fsdp: parse+codegen 0.47-0.55 s, convert  9.25-9.61 s,  ratio 17.5-19.6x, 10.5-10.9 files/s
      after  --to ddp : parse+codegen 0.44-0.54 s, convert  4.83-5.07 s,  ratio  9.3-10.9x, 20-21 files/s
      after  --to dp  : parse+codegen 0.44-0.54 s, convert  1.75-1.97 s,  ratio  3.6-4.0x, 51-58 files/s
      after  --to fsdp: parse+codegen 0.44-0.54 s, convert  4.17-4.19 s,  ratio  7.7-9.5x, 24 files/s
    after, ddp profile (--breakdown): analyze 41% (440 calls: 1 per file, 1 per edit pass, 1 for the
      lint), codegen 26% (the code of each edit pass is analysed again), CST passes 10% (positions 2%),
      lint of the output 12% (mostly its analyze), imports added 1%, line map 2%.

    back to back at 19:15 UTC (idle machine; each the best of 3 interleaved rounds), 831216f then
    HEAD (fewer stages: 4.2 -> 2.7 per ddp file, 2.4 -> 2.0 dp; one tree walk per analysis; the last
    stage adds the imports; and, new work, the width pass that lays out widened lines), two runs:
      before --to ddp : parse+codegen 0.39-0.40 s, convert 4.16-4.21 s, ratio 10.6x, 24 files/s
      before --to dp  : parse+codegen 0.39-0.40 s, convert 1.52-1.58 s, ratio 3.9-4.0x, 64-66 files/s
      before --to fsdp: parse+codegen 0.39-0.40 s, convert 3.39-3.48 s, ratio 8.5-8.9x, 29-30 files/s
      after  --to ddp : parse+codegen 0.41-0.46 s, convert 3.13-3.48 s, ratio 7.6x, 29-32 files/s
      after  --to dp  : parse+codegen 0.41-0.46 s, convert 1.22-1.32 s, ratio 2.9-3.0x, 76-83 files/s
      after  --to fsdp: parse+codegen 0.41-0.46 s, convert 2.45-2.78 s, ratio 5.9-6.1x, 36-41 files/s
    a second sitting at 19:37 (facda89, the machine a little slower: before 10.6-10.7x, 3.7-3.9x,
    8.7-9.0x): after ddp 8.4-9.0x, dp 3.2-3.4x, fsdp 6.8-7.1x. dp is at about 3x, not reliably under.
    Where ddp's time goes now (wall clock, not profiled): analysis 22% (1 per file, 1.7 per file
    after edit passes, 1 in the lint), LibCST parse 19% (the file once, inserted snippets), codegen
    15%, lint of the output 14%, edit passes 13%, planning 7%, width pass 8%. A single-stage
    conversion would still pay parse + analysis + plan + one pass + codegen + the lint's analysis of
    the output: about 3.5x of a bare parse+codegen on this corpus, so 3x needs more than fewer stages.

    back to back at 20:40 and 21:02 UTC (f8f8ebb, in a worktree with its own venv, then HEAD; best of
    3 interleaved rounds; the machine noisier at 21:02), after: each inserted snippet parsed once
    (769 LibCST parses of 51 texts became 51), the analysis walking children without ast's
    generators and skipping operator/context leaves (corpus analysis 248 -> 195 ms), the edit pass
    leaving unedited statements' expressions unvisited, the width pass entering only statements
    over wide lines; and, new work, string splitting in the width pass:
      before --to ddp : ratio 8.2-8.5x, 27-32 files/s   after: 6.5-7.2x, 30-39 files/s
      before --to dp  : ratio 3.1-3.4x, 69-85 files/s   after: 2.8-3.1x, 69-92 files/s
      before --to fsdp: ratio 6.5-6.7x, 34-41 files/s   after: 5.2-5.9x, 37-48 files/s
    Where ddp's time goes now (wall clock, one round): codegen 19% (616 renders: a stage's whole
    module, the width pass's statements), analysis 23% (stages 17%, first 6%), lint of the output
    13%, LibCST parse 12%, width pass 10%, edit passes 10%, planning 8%. An experiment that planned
    every transform on the first anatomy and made all edits in one pass (outputs wrong, for timing
    only) still took 6.5x: the stages cost ~13%, so 3x needs the output's re-analysis, the lint
    of it and the codegen to shrink, not only fewer stages.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from functools import partial
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddpify.convert import TARGETS, convert_source  # noqa: E402

BREAKDOWN = {  # what the profile reports: label -> (file suffix, function name), cumulative seconds
    "analyze (anatomy)": ("ddpify/anatomy/analyzer.py", "analyze"),
    "CST passes": ("ddpify/codemods/base.py", "apply"),
    "  of which positions": ("libcst/metadata/wrapper.py", "resolve"),
    "codegen (.code)": ("libcst/_nodes/module.py", "code"),
    "imports added": ("ddpify/codemods/imports.py", "add_imports"),
    "line map (difflib)": ("ddpify/codemods/pipeline.py", "_carry_origins"),
    "lint of the output": ("ddpify/convert.py", "lint_leftovers"),
}


def corpus() -> list[Path]:
    fixtures = ROOT / "fixtures"
    projects = [*fixtures.glob("real/*_project"), *(fixtures / "projects").iterdir()]
    return sorted([*fixtures.glob("*.py"), *fixtures.glob("real/*.py"), *(p for d in projects for p in d.rglob("*.py"))])


def seconds(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def convert_all(texts: dict[Path, str], target: str) -> None:
    for path, text in texts.items():
        convert_source(text, target, path=str(path))


def breakdown(texts: dict[Path, str], target: str) -> None:
    """Cumulative seconds (under the profiler) of the pipeline's main parts."""
    profile = cProfile.Profile()
    profile.runcall(convert_all, texts, target)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(tt for _, _, tt, _, _ in stats.values())
    for label, (suffix, name) in BREAKDOWN.items():
        rows = [(calls, cum) for (file, _, fn), (_, calls, _, cum, _) in stats.items() if fn == name and file.endswith(suffix)]
        calls, cum = sum(r[0] for r in rows), sum(r[1] for r in rows)
        print(f"    {label:<20} {cum:7.2f} s  {100 * cum / total:5.1f}%  ({calls} calls)")
    print(f"    {'total (profiled)':<20} {total:7.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", nargs="+", default=list(TARGETS), choices=TARGETS)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each figure is its best round")
    parser.add_argument("--breakdown", action="store_true", help="profile one more conversion per target")
    args = parser.parse_args()
    texts = {path.relative_to(ROOT): path.read_text() for path in corpus()}
    print(f"corpus: {len(texts)} files, {sum(t.count(chr(10)) for t in texts.values())} lines")
    convert_source(next(iter(texts.values())), "ddp")  # imports and first-use caches out of the timings
    best: dict[str, float] = {}
    for _ in range(args.rounds):  # bare and converts side by side, so load on the machine hits both alike
        for label, work in [("bare", lambda: [cst.parse_module(text).code for text in texts.values()]),
                            *((target, partial(convert_all, texts, target)) for target in args.to)]:
            best[label] = min(best.get(label, float("inf")), seconds(work))
    for target in args.to:
        print(f"--to {target:<4}: parse+codegen {best['bare']:6.2f} s, convert {best[target]:6.2f} s, "
              f"ratio {best[target] / best['bare']:5.1f}x, {len(texts) / best[target]:6.1f} files/s", flush=True)
        if args.breakdown:
            breakdown(texts, target)


if __name__ == "__main__":
    main()
