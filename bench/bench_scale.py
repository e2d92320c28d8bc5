"""Seconds to convert and lint a 50,000-line training-like script, and to lint a 5,000-file tree.

    python bench/bench_scale.py [--lines 50000] [--files 5000]

Each measurement runs `python -m ddpify ...` in its own process (so interpreter and torch start-up
are included, as a user sees them) on generated inputs in a temporary directory.

convert_source --to ddp in one process (65977ad, 2 shared cores), the tests' big_script:
    19,996 lines: parse+codegen 2.7 s, convert  39.4 s (14.4x)
    49,997 lines: parse+codegen 6.7 s, convert 156.2 s (23.5x): it converts, but more than linearly

`python bench/bench_scale.py --files 200` at 1242ed5 (idle 2-core machine):
    convert --to ddp 49,997-line script: 123.0 s; --to dp: 65.3 s; lint: 4.4 s; 200-file tree: 0.7 s
The growth beyond linear was the line map (pipeline._carry_origins): difflib's SequenceMatcher over
the whole file per edit pass, quadratic on the many repeated lines of a generated script
(find_longest_match: 36% of a 15,000-line conversion's profile). Above 2,000 lines it now lets
difflib pass over popular lines (autojunk): `--files 10` right after: convert --to ddp 56.3 s,
--to dp 37.9 s (15,000 lines: 20.0 s -> 13.0 s, the same output and reported lines).

`--files 10` at 19:20 UTC (fewer stages, one walk per analysis, and the new width pass): convert
--to ddp 41.3 s, --to dp 30.1 s, lint 4.8 s.

`--files 10` at 20:40 UTC (snippets parsed once, a leaner analysis walk and edit pass): convert
--to ddp 35.3 s, --to dp 28.8 s, lint 4.3 s.

`--files 10` at 22:35 UTC (stage renders reuse unchanged statements' text, fewer DDP stages):
convert --to ddp 30.1 s, --to dp 25.5 s, lint 4.0 s. (Until then a tree of fewer than 50 files was
generated empty: the `--files 10` trees above linted nothing.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_robustness import big_script, make_tree  # noqa: E402  (the same inputs as the tests)


def timed(args: list[str], cwd: Path) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "ddpify", *args], cwd=cwd, env=env, capture_output=True)
    return time.perf_counter() - started, result.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--files", type=int, default=5_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        script = work / "big.py"
        script.write_text(big_script(args.lines))
        lines = script.read_text().count("\n")
        for name, cmd in (("convert --to ddp", ["convert", "big.py", "--to", "ddp", "-q"]),
                          ("convert --to dp", ["convert", "big.py", "--to", "dp", "-q"]),
                          ("lint", ["lint", "big.py"])):
            seconds, rc = timed(cmd, work)
            print(f"{name:<18} {lines:>6}-line script: {seconds:8.2f} s (exit {rc})", flush=True)
        tree = work / "tree"
        counts = make_tree(tree, args.files)
        seconds, rc = timed(["lint", "."], tree)
        print(f"{'lint':<18} {counts['total']:>6}-file tree:   {seconds:8.2f} s (exit {rc}; "
              f"{counts['linted']} linted after .gitignore/exclude)", flush=True)


if __name__ == "__main__":
    main()
