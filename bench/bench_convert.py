"""Seconds to convert a corpus of varied scripts, against a bare LibCST parse + codegen of the same files.

    python bench/bench_convert.py [--to ddp dp fsdp] [--breakdown]

The corpus is every script the tests convert: fixtures/*.py, fixtures/real/*.py and the modules of
the projects in fixtures/real/*_project/ and fixtures/projects/ (each converted on its own, without
its project's facts). For each target it prints the seconds of `libcst.parse_module(text).code`
over the corpus, of `convert_source(text, target)`, their ratio, and files/s; `--breakdown` then
profiles one more conversion of the corpus and prints where its time goes.

Figures (101 files, 5,264 lines; 2 shared CPU cores, so expect noise of ~20%):

    before (one anatomy and one CST pass per transform):
      --to ddp : parse+codegen 1.24 s, convert 57.12 s, ratio 46.0x, 1.8 files/s
      --to dp  : parse+codegen 1.24 s, convert 21.53 s, ratio 17.3x, 4.7 files/s
      --to fsdp: parse+codegen 1.24 s, convert 89.44 s, ratio 72.1x, 1.1 files/s
      (ddp profile: analyze 29%, 1235 calls; CST passes 47%, 1053 calls; lint of the output 3.5%)
    after (stages: transforms planned on one anatomy, their edits made in one pass; 4b3a719):
      --to ddp : parse+codegen 1.18 s, convert 24.17 s, ratio 20.5x, 4.2 files/s
      --to dp  : parse+codegen 1.18 s, convert  8.36 s, ratio  7.1x, 12.1 files/s
      --to fsdp: parse+codegen 1.18 s, convert 23.51 s, ratio 20.0x, 4.3 files/s
      (ddp profile: analyze 28%, 416 calls, ~4 per file with the lint's; CST passes ~43%, 3 per
      converted file, of which LibCST positions ~26%; imports added ~10%; lint of the output ~10%)
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
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
    "imports added": ("ddpify/codemods/pipeline.py", "_add_imports"),
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
    parser.add_argument("--breakdown", action="store_true", help="profile one more conversion per target")
    args = parser.parse_args()
    texts = {path.relative_to(ROOT): path.read_text() for path in corpus()}
    print(f"corpus: {len(texts)} files, {sum(t.count(chr(10)) for t in texts.values())} lines")
    convert_source(next(iter(texts.values())), "ddp")  # imports and first-use caches out of the timings
    bare = seconds(lambda: [cst.parse_module(text).code for text in texts.values()])
    for target in args.to:
        converted = seconds(lambda: convert_all(texts, target))
        print(f"--to {target:<4}: parse+codegen {bare:6.2f} s, convert {converted:6.2f} s, "
              f"ratio {converted / bare:5.1f}x, {len(texts) / converted:6.1f} files/s", flush=True)
        if args.breakdown:
            breakdown(texts, target)


if __name__ == "__main__":
    main()
