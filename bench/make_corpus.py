"""Generate a lint benchmark corpus: variants of fixtures/*.py plus some files that never mention torch.

Each variant renames the script's own variables, functions and classes, and is turned into a
DDP script (an `init_process_group` call after the imports), a DataParallel script, or left
single-GPU, so every group of rules gets work.

    python bench/make_corpus.py OUTDIR [--count 2200] [--seed 0]
"""

from __future__ import annotations

import argparse
import ast
import builtins
import io
import random
import tokenize
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FILES_PER_DIR = 100
NON_TORCH_SHARE = 0.1
MAKE_DDP = "import torch.distributed as dist\ndist.init_process_group('nccl')\n"
MAKE_DP = "_replicas = torch.nn.DataParallel(torch.nn.Linear(1, 1))\n"


def bound_names(tree: ast.AST) -> set[str]:
    """Names the script binds itself (not parameters, imports or builtins): safe to rename."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    parameters = {a.arg for node in ast.walk(tree) if isinstance(node, ast.arguments)
                  for a in (*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg, node.kwarg) if a}
    imported = {(a.asname or a.name).split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    special = {n for n in names if n.startswith("__")} | {"self", "cls", "main", "forward"}
    return names - parameters - imported - set(dir(builtins)) - special


def rename(text: str, suffix: str) -> str:
    """Append `suffix` to every renamable name token (not attributes, not keyword arguments)."""
    names = bound_names(ast.parse(text))
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    out, depth = [], 0
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        prev = tokens[i - 1].string if i else ""
        nxt = tokens[i + 1].string if i + 1 < len(tokens) else ""
        keyword_argument = depth > 0 and nxt == "="
        if tok.type == tokenize.NAME and tok.string in names and prev != "." and not keyword_argument:
            tok = tok._replace(string=tok.string + suffix)
        out.append(tok)
    return tokenize.untokenize(out)


def after_imports(text: str, addition: str) -> str:
    """Insert `addition` after the last top-level import."""
    tree = ast.parse(text)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if not imports:
        return addition + text
    lines = text.splitlines(keepends=True)
    cut = imports[-1].end_lineno
    return "".join(lines[:cut]) + addition + "".join(lines[cut:])


def torch_variant(text: str, index: int, rng: random.Random) -> str:
    variant = rename(text, f"_{index}")
    flavour = rng.random()
    if flavour < 0.5:
        return after_imports(variant, MAKE_DDP)
    if flavour < 0.7 and "import torch\n" in variant:
        return after_imports(variant, MAKE_DP)
    return variant


def plain_module(index: int, rng: random.Random) -> str:
    """A small module that never mentions the framework (skipped by the linter before parsing)."""
    funcs = []
    for j in range(rng.randint(3, 12)):
        funcs.append(
            f"def helper_{index}_{j}(values, scale={rng.randint(1, 9)}):\n"
            f"    total = 0\n    for v in values:\n        total += v * scale\n    return total / max(len(values), 1)\n"
        )
    return f'"""Utility module {index}."""\n\nimport math\n\n\n' + "\n\n".join(funcs)


def make_corpus(out: Path, count: int = 2200, seed: int = 0) -> int:
    """Write `count` Python files under `out`; returns the number written."""
    rng = random.Random(seed)
    sources = [p.read_text(encoding="utf-8") for p in sorted(FIXTURES.glob("*.py"))]
    for index in range(count):
        if rng.random() < NON_TORCH_SHARE:
            text = plain_module(index, rng)
        else:
            text = torch_variant(sources[index % len(sources)], index, rng)
        path = out / f"group_{index // FILES_PER_DIR:03}" / f"script_{index:05}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=2200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"wrote {make_corpus(args.out, args.count, args.seed)} files under {args.out}")


if __name__ == "__main__":
    main()
