"""Seconds to convert a corpus of varied scripts, against a bare LibCST parse + codegen of the same files.

    python bench/bench_convert.py [--to ddp dp fsdp] [--rounds 3] [--breakdown] [--floor]

The corpus is every script the tests convert: fixtures/*.py, fixtures/real/*.py and the modules of
the projects in fixtures/real/*_project/ and fixtures/projects/ (each converted on its own, without
its project's facts). For each target it prints the seconds of `libcst.parse_module(text).code`
over the corpus, of `convert_source(text, target)`, their ratio, and files/s, each the best of
`--rounds` interleaved rounds; `--breakdown` then profiles one more conversion of the corpus and
prints where its time goes (under the profiler, whose overhead inflates LibCST's many small calls);
`--floor` prints, for the first target, the parts no conversion can skip: LibCST's parse of the
input, its analysis, the lint of the output (every conversion is linted: what ddpify's rules still
find is a missing item) and the codegen of the output, each as a multiple of the bare figure.

Figures (103 files, 5,399 lines; 2 CPU cores shared with other work: expect noise of ~20% and
compare only figures taken back to back):

    history (each pair back to back on this 2-core machine): 79x -> 23.6x (one CST pass per stage,
    not per transform), -> 9.3-10.9x (statements located by the ast, imports inserted directly),
    -> 7.6x (fewer stages, one tree walk per analysis), -> 6.5-7.2x (snippets parsed once, leaner
    analysis walk, edit and width passes entering only what they change) for --to ddp.

    back to back at 22:30 UTC, 6c6b0de then 6bd066b (each in its own worktree and venv; best of 3
    interleaved rounds, two sittings each), after: stage renders reuse the text of every statement
    an earlier render made (codemods/codegen.py); evaluation and log-loss helpers go in the room
    setup leaves, pending or made, so they no longer wait for setup's stage; `.module` access is
    planned only where a model is read through what its wrapper lacks (judged before the wrap):
      before --to ddp : ratio 6.9-7.0x, 32-35 files/s    after: 5.7-6.0x, 41-42 files/s
      before --to dp  : ratio 2.8-2.9x, 75-86 files/s    after: 2.4-2.6x, 94-101 files/s
      before --to fsdp: ratio 5.3-5.5x, 41-44 files/s    after: 5.0-5.1x, 48-49 files/s
    --floor at 6bd066b: what any conversion pays, whatever its design, is 2.7x for ddp (parse of the
    input 0.86x, its analysis 0.47x, the lint of the output 0.89x, codegen of the output 0.49x: a
    converted file has about twice the input's lines, the distributed helpers), 2.2x for dp, 2.6x
    for fsdp. So 3x leaves 0.3x for planning, edits, the stages' analyses, the width pass and the
    line map: out of reach while every conversion is linted. The stages left: a DDP conversion is
    planned in 2-3 (setup and wrap with samplers and log-loss; `.module` access when it has work;
    rank 0, whose plan reads the wrap, the evaluation helpers and the printed losses); removing the
    rank-0 stage (outputs wrong, timing only) gives 5.0-5.3x.

    From 2026-11-26 the figures are CPU seconds of the process (`seconds`): wall seconds swung 2x
    between rounds on the shared machine. The corpus is now 127 files and each conversion does more
    (new transforms and rules), so the ratios are not comparable with those above. One process, the
    changes of 3c3b86b..HEAD toggled off and on, best of 3 interleaved rounds (rank 0 planned ahead
    of the first stage's edits: one stage for 48 of 105 pipeline runs of --to ddp, 53 of --to fsdp,
    so one analysis and one CST pass fewer there; calls_collective answered from one per-anatomy set,
    for DDP020; ScriptTree.qualname remembered per node):
      before --to ddp : ratio 8.5x     after: 7.25x
      before --to fsdp: ratio 6.7x     after: 5.5x
    Still above 5x for ddp: what the profile shows next is the lint of the output (a third of the
    time: its analysis, DDP020's and the seeding rules' whole-script questions), the stages that
    still re-analyse (`.module` access after the wrap; rank 0 where its plan reads the wrap or the
    evaluation's collectives), codegen of each stage, and the width pass.

    At ba047b9 against a294c4d's versions of the files it changed (each a copy of one checkout, run
    alternately, best of 3 rounds, CPU seconds; bare figure the better of the two runs, 0.85 s):
    the anatomy remembers what every pass, rule and transform asks it again (a call's callee, a
    node's variable, an expression's roles once the value flow has settled, each function's walked
    body, the calls in each function for the seeding question), and positions come from LibCST's
    PositionProvider without MetadataWrapper's extra walk of the tree:
      before --to ddp : 6.23 s, 7.3x     after: 5.40 s, 6.35x
      before --to fsdp: 4.68 s, 5.5x     after: 4.17 s, 4.9x
      before --to dp  : 2.47 s, 2.9x     after: 2.31 s, 2.7x
      before --to acc.: 4.20 s, 4.9x     after: 3.85 s, 4.5x
    --to ddp is still above 5x: the lint of the output (a quarter of the time: its ast parse and
    analysis, then DDP020 and the seeding rules), the analyses of the input and of later stages
    (`.module` access waits for the wrap in 38 of 105 runs, rank 0 in 28), the width pass, the
    edits and codegen.

    At 2634ca1 against 6eb7cdf (two worktrees, A B A B A B back to back, median of the 3 runs of
    best-of-3 rounds, CPU seconds; docs/performance.md has the table, an earlier set and what was
    cut: the garbage collector's thresholds raised while converting, DDP020's rank test first, the
    seeding question once per function, child_nodes by the grammar):
      before --to ddp : 5.46 s, 6.7x     after: 4.01 s, 5.9x  (bare figures 0.64-0.86 s)
      before --to fsdp: 4.26 s, 5.0x     after: 2.85 s, 4.2x
      before --to dp  : 2.41 s, 2.8x     after: 1.68 s, 2.4x
      before --to acc.: 3.40 s, 4.5x     after: 2.64 s, 3.9x

    At 3bf2518 against 1cc31bd (the same way; renders that ask for no positions record none, and
    positions found without a regular-expression split per token):
      before --to ddp : 4.22 s, 5.9x     after: 3.98 s, 6.0x  (bare figures 0.63-0.74 s)
      before --to fsdp: 3.11 s, 4.3x     after: 2.96 s, 4.5x
      before --to dp  : 1.77 s, 2.5x     after: 1.74 s, 2.6x
      before --to acc.: 2.86 s, 4.0x     after: 2.62 s, 3.9x

    At 3ee58cf against 2ab28f6 (the same way, twice; `.module` access and rank 0 planned in the wrap's
    stage on an anatomy that shows the wrap made, anatomy/distributed/wraps_made.py):
      before --to ddp : 4.16, 3.92 s, 5.7x, 6.0x     after: 3.80, 3.55 s, 5.3x, 5.5x

    At c0745e1 against 1df1c48 (the same way, three times; fewer extra stages, 28 -> 17: a hoist
    named fresh in the pending edits' output, the loss scaling and the reseeds planned ahead; compound
    headers located only where rewritten; wide statements taken from the module, not parsed again;
    a rank test judged once per statement; docs/performance.md):
      before --to ddp : 3.46, 3.48, 3.49 s, 5.2x-5.3x     after: 3.24, 3.24, 3.28 s, 4.7x-4.9x
"""

from __future__ import annotations

import argparse
import ast
import cProfile
import pstats
import sys
import time
from functools import partial
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ddpify.anatomy import analyze  # noqa: E402
from ddpify.convert import TARGETS, convert_source, lint_leftovers  # noqa: E402

BREAKDOWN = {  # what the profile reports: label -> (file suffix, function name), cumulative seconds
    "analyze (anatomy)": ("ddpify/anatomy/analyzer.py", "analyze"),
    "CST passes": ("ddpify/edits/engine.py", "apply"),
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


def floor(texts: dict[Path, str], target: str, rounds: int) -> None:
    """The seconds of what every conversion pays, whatever its design, against the bare figure (each
    timed with no more trees alive than it needs: the garbage collector's passes grow with them)."""
    def best(work) -> float:
        return min(seconds(work) for _ in range(rounds))

    bare = best(lambda: [cst.parse_module(text).code for text in texts.values()])
    spent = {"parse of the input": best(lambda: [cst.parse_module(text) for text in texts.values()]),
             "analysis of the input": best(lambda: [analyze(text, str(path)) for path, text in texts.items()])}
    results = {path: convert_source(text, target, path=str(path)) for path, text in texts.items()}
    spent["lint of the output"] = best(lambda: [lint_leftovers(result, ast.parse(result.output), str(path))
                                                for path, result in results.items() if result.changed])
    outputs = [cst.parse_module(result.output) for result in results.values()]
    results.clear()
    spent["codegen of the output"] = best(lambda: [module.code for module in outputs])
    for label, figure in [*spent.items(), ("floor (their sum)", sum(spent.values()))]:
        print(f"    {label:<22} {figure:6.2f} s  {figure / bare:4.2f}x")


def seconds(work) -> float:
    """CPU seconds of this process: other work on the machine barely moves the figure (wall seconds,
    on the 2 cores that ~8 sessions share, varied by 2x between rounds)."""
    started = time.process_time()
    work()
    return time.process_time() - started


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
    parser.add_argument("--floor", action="store_true", help="time what no conversion can skip (first target)")
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
    if args.floor:
        print(f"what every --to {args.to[0]} conversion pays:")
        floor(texts, args.to[0], args.rounds)


if __name__ == "__main__":
    main()
