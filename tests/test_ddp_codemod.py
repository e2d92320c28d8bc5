"""`ddpify convert --to ddp` on every fixture: snapshots, idempotence, formatting, and real runs.

Snapshots live in fixtures/expected/ddp/<fixture>.py. After an intended change to the codemod,
regenerate them with `DDPIFY_UPDATE_SNAPSHOTS=1 pytest tests/test_ddp_codemod.py -k snapshot`
and read the diff before committing it.

The execution tests run each snapshot for real, on CPU with gloo:

* under `torchrun --standalone --nproc_per_node=2`, with each rank's stdout captured on its own
  (`--redirects 1 --log-dir`): it must exit 0, rank 1 must print nothing, rank 0 must print the
  original's lines in the original's order with half the per-step lines (each rank trains on half
  of the data), write the same files (checkpoints with the same keys, no `module.` prefix), and a
  probe (a `sitecustomize` on PYTHONPATH) checks that every rank really trained a
  DistributedDataParallel model and that the ranks end with identical parameters;
* as plain `python` (world size 1): it must print the same lines as the original, step for step.
"""

from __future__ import annotations

import ast
import difflib
import functools
import io
import json
import os
import re
import shutil
import sys
import textwrap
import tokenize
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from ddpify.codemods.pipeline import Status
from ddpify.convert import convert_source

try:
    from helpers import FIXTURES_DIR, failure_report, one_line, python_argv, run_script, written_files
except ImportError:  # e.g. pytest --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import FIXTURES_DIR, failure_report, one_line, python_argv, run_script, written_files

EXPECTED_DIR = FIXTURES_DIR / "expected" / "ddp"
FIXTURES = sorted(p for p in FIXTURES_DIR.glob("*.py") if p.is_file())
IDS = [p.name for p in FIXTURES]
BY_NAME = {p.name: p for p in FIXTURES}
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt")
TEXT_SUFFIXES = (".txt", ".log", ".csv")
TIMEOUT = 180
NPROC = 2


@functools.lru_cache(maxsize=None)
def convert(path: Path, batch_size: str = "per-gpu"):
    return convert_source(path.read_text(), "ddp", path=path.name, batch_size=batch_size)


def fixture_params(xfails: dict[str, str]) -> list:
    """Every fixture, with the known codemod bugs in `xfails` marked strict xfail (so a fix shows)."""
    unknown = set(xfails) - set(IDS)
    assert not unknown, f"xfail for fixtures that don't exist: {unknown}"
    return [
        pytest.param(p, id=p.name, marks=[pytest.mark.xfail(strict=True, reason=xfails[p.name])] if p.name in xfails else [])
        for p in FIXTURES
    ]


# ===== snapshots ===============================================================================
def test_every_fixture_has_a_snapshot():
    assert len(FIXTURES) >= 20
    assert sorted(p.name for p in EXPECTED_DIR.glob("*.py")) == IDS


@pytest.mark.parametrize("script", FIXTURES, ids=IDS)
def test_snapshot(script: Path):
    expected = EXPECTED_DIR / script.name
    result = convert(script)
    if os.environ.get("DDPIFY_UPDATE_SNAPSHOTS") == "1":
        expected.parent.mkdir(parents=True, exist_ok=True)
        expected.write_text(result.output)
    assert result.changed and result.changes, "every fixture is a single-GPU script with work to do"
    assert result.output == expected.read_text()


REPORTS = EXPECTED_DIR / "reports.json"


def report_lines(result) -> list[str]:
    """What `ddpify convert` prints for a file: one line per change, warning and missing item (original line numbers)."""
    return ([f"{c.line}: [{c.transform}] {c.message}" for c in result.changes] + [f"{a.line}: warning: {a.message}" for a in result.advice]
            + [f"{m.line}: missing: {m.what}; {m.todo}" for m in result.missing])


def test_reports_snapshot():
    """The changes, warnings and missing items reported for each fixture, with their line numbers (reports.json)."""
    reports = {p.name: report_lines(convert(p)) for p in FIXTURES}
    if os.environ.get("DDPIFY_UPDATE_SNAPSHOTS") == "1":
        REPORTS.write_text(json.dumps(reports, indent=1) + "\n")
    assert reports == json.loads(REPORTS.read_text())


@pytest.mark.parametrize("script", FIXTURES, ids=IDS)
def test_every_reported_line_points_at_its_statement(script: Path):
    """A change's line is in the original statement it talks about (no drift from inserted lines)."""
    lines = script.read_text().splitlines()
    for change in convert(script).changes:
        text = lines[change.line - 1]
        if change.transform == "module":
            assert change.message.split(" -> ")[0] in text, (change, text)
        elif change.transform == "sampler" and "sharded" in change.message:
            assert "DataLoader(" in text or "DL(" in text, (change, text)
        elif change.transform == "sampler" and "set_epoch" in change.message:
            assert text.lstrip().startswith("for ") or "iter(" in text, (change, text)
        elif change.transform == "rank0" and change.message == "print on rank 0 only":
            assert "print(" in text or ".write(" in text, (change, text)
        elif change.transform == "rank0" and change.message == "torch.save on rank 0 only":
            assert "torch.save(" in text, (change, text)
        elif change.transform == "device":
            assert "cuda" in text or "set_device" in text or ".to(" in text, (change, text)


ADVICE = {  # fixture: words the advice for what the codemod can't do safely must contain
    # the global batch grew WORLD_SIZE times (--batch-size per-gpu): the learning-rate factor
    "validation_accuracy.py": "multiply Adam's learning rate by math.sqrt(WORLD_SIZE)",
    "two_loaders.py": "multiply SGD's learning rate by WORLD_SIZE (linear scaling rule",
    "helper_functions.py": "multiply AdamW's learning rate by math.sqrt(WORLD_SIZE)",
}


@pytest.mark.parametrize("name", sorted(ADVICE))
def test_advice_for_what_is_left_to_the_user(name: str):
    assert any(ADVICE[name] in a.message for a in convert(BY_NAME[name]).advice)


def test_a_loader_drawn_with_next_is_sharded_and_each_restart_is_a_new_epoch():
    """step_based_iter draws batches with next() from `iter(loader)`, restarted on StopIteration."""
    result = convert(BY_NAME["step_based_iter.py"])
    output = one_line(result.output)
    assert result.status is Status.CONVERTED and "sampler=DistributedSampler(" in output
    restart = "loader.sampler.set_epoch(loader.sampler.epoch + 1)"
    assert output.count(restart) == 1 and output.index(restart) < output.index("data_iter = iter(loader)", output.index("StopIteration"))


@pytest.mark.parametrize("script", FIXTURES, ids=IDS)
def test_snapshot_compiles_and_sets_up_the_process_group(script: Path):
    output = (EXPECTED_DIR / script.name).read_text()
    tree = ast.parse(output)
    called = Counter(ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call))
    assert called["setup_distributed"] == 1 and called["cleanup_distributed"] == 1
    assert called["DDP"] >= 1, "the trained model is wrapped in DistributedDataParallel"


@pytest.mark.parametrize("script", FIXTURES, ids=IDS)
def test_converting_again_changes_nothing(script: Path):
    converted = (EXPECTED_DIR / script.name).read_text()
    again = convert_source(converted, "ddp", path=script.name)
    assert again.output == converted
    assert not again.changes and not again.changed
    assert "already distributed" in again.note


# ===== formatting ==============================================================================
def simple_statement_lines(source: str, change_lines: set[int]) -> set[int]:
    """Lines of the simple statements (not blocks) that a reported change points into."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and not hasattr(node, "body"):
            span = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
            if change_lines & span:
                lines |= span
    return lines


def _imported(tree: ast.Module) -> set[tuple]:
    names: set[tuple] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {(None, a.name, a.asname) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {(node.module, a.name, a.asname) for a in node.names}
    return names


def extended_import_lines(source: str, output: str) -> set[int]:
    """Top-level imports may gain names (DistributedSampler), as long as they keep all of theirs."""
    kept = _imported(ast.parse(output))
    lines: set[int] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and _imported(ast.Module([node], [])) <= kept:
            lines |= set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def unexplained_edits(source: str, output: str, change_lines: set[int]) -> list[str]:
    """Original lines that differ in the output although no reported change explains them.

    A line of the original may differ only if it belongs to a simple statement that a reported
    change points into, or to a top-level import that keeps all its names, or if it is there
    unchanged but for its indentation (moved under `if RANK == 0:` / `with model.no_sync():`),
    in order. Everything else must be in the output byte for byte, in the same order.
    """
    old, new = source.splitlines(), output.splitlines()
    allowed = simple_statement_lines(source, change_lines) | extended_import_lines(source, output)
    problems = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag not in ("replace", "delete"):
            continue
        reindented = [line.strip() for line in new[j1:j2]]
        k = 0
        for n in range(i1 + 1, i2 + 1):
            if n in allowed:
                continue
            found = next((m for m in range(k, len(reindented)) if reindented[m] == old[n - 1].strip()), None)
            if found is None:
                problems.append(f"line {n} {old[n - 1]!r}")
            else:
                k = found + 1
    return problems


def comments(source: str) -> Counter:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return Counter(tok.string for tok in tokens if tok.type == tokenize.COMMENT)


def docstrings(source: str) -> Counter:
    nodes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))]
    return Counter(ast.get_docstring(n, clean=False) for n in nodes if ast.get_docstring(n, clean=False))


@pytest.mark.parametrize("script", FIXTURES, ids=IDS)
def test_only_changed_statements_differ(script: Path):
    source = script.read_text()
    result = convert(script)
    old = source.splitlines()
    allowed = simple_statement_lines(source, {c.line for c in result.changes})
    assert 0 < len(allowed) < len(old) / 2, "the check must leave most of the file to compare"
    same = sum(b.size for b in difflib.SequenceMatcher(a=old, b=result.output.splitlines(), autojunk=False).get_matching_blocks())
    assert same >= 2 * len(old) / 3, f"only {same} of {len(old)} original lines survive byte for byte"
    assert unexplained_edits(source, result.output, {c.line for c in result.changes}) == []
    assert comments(source) <= comments(result.output)
    assert docstrings(source) <= docstrings(result.output)
    assert ast.get_docstring(ast.parse(result.output)) == ast.get_docstring(ast.parse(source))


def test_the_formatting_check_catches_edits_nobody_reported():
    """The check above is not vacuous: each of these edits of a real conversion is caught."""
    script = BY_NAME["basic_main.py"]
    source = script.read_text()
    result = convert(script)
    changes = {c.line for c in result.changes}
    output = result.output
    assert unexplained_edits(source, output, changes) == []
    mutations = {
        "spacing": ("x = torch.randn(128, 16)", "x = torch.randn(128,16)"),
        "comment": ("# synthetic classification data", "# synthetic data"),
        "quotes": ('device = torch.device("cuda"', "device = torch.device('cuda'"),
        "deleted line": ("\n        model.train()\n", "\n"),
        "deleted blank line": ('else "cpu")\n\n', 'else "cpu")\n'),
    }
    for what, (before, after) in mutations.items():
        assert output.count(before) == 1, what
        assert unexplained_edits(source, output.replace(before, after), changes), f"{what} not caught"
    # swapping two untouched lines is caught too
    lines = output.splitlines(keepends=True)
    i = next(n for n, line in enumerate(lines) if "criterion = nn.CrossEntropyLoss()" in line)
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    assert unexplained_edits(source, "".join(lines), changes), "swap not caught"


@pytest.mark.parametrize("name", ["basic_main.py", "notebook_style.py", "checkpoint_resume.py", "grad_accumulation.py"])
def test_crlf_input_gives_crlf_output(name: str):
    source = BY_NAME[name].read_text()
    crlf = convert_source(source.replace("\n", "\r\n"), "ddp", path=name)
    assert crlf.changed
    assert crlf.output.count("\n") == crlf.output.count("\r\n"), "a bare LF in the output of a CRLF file"
    assert crlf.output.replace("\r\n", "\n") == convert(BY_NAME[name]).output


def test_comments_and_docstrings_next_to_edits_survive():
    source = textwrap.dedent('''\
        """Module docstring."""
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        def main():
            """Train it."""
            model = torch.nn.Linear(2, 1)  # tiny
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            # the data
            loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4, shuffle=True)  # shuffled
            for epoch in range(2):
                for x, y in loader:
                    loss = (model(x) - y).pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    # report
                    print(loss.item())  # every step
            # keep it
            torch.save(model.state_dict(), "m.pt")  # weights only


        if __name__ == "__main__":
            main()
        ''')
    output = convert_source(source, "ddp").output
    assert comments(source) <= comments(output)
    assert docstrings(source) <= docstrings(output)
    assert '"""Module docstring."""\n' == output.splitlines(keepends=True)[0]
    assert re.search(r"# report\n *if RANK == 0:\n *print\(loss_avg.item\(\)\)  # every step\n", output), output  # --log-loss reduced
    assert re.search(r"# keep it\n *if RANK == 0:\n *torch.save\(model.module.state_dict\(\), \"m.pt\"\)  # weights only\n", output), output
    assert re.search(r"# the data\n *# ddpify: batch_size per process.*\n *loader = DataLoader\((.|\n)*?\)  # shuffled\n", output), output


# ===== running them ============================================================================
# A `sitecustomize` the converted runs import first: it records every model wrapped in
# DistributedDataParallel and, when the script leaves the process group (or exits), writes this
# rank's world size, number of wraps and final parameters to $DDPIFY_PROBE_DIR/rank<R>.json.
PROBE = '''
import os

_DIR = os.environ.get("DDPIFY_PROBE_DIR")
_ACTIVE = bool(_DIR) and ("LOCAL_RANK" in os.environ or os.environ.get("DDPIFY_PROBE_WORKERS_ONLY") != "1")
if _ACTIVE:
    import atexit
    import json

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    _wrapped = []
    _written = []
    _init = DistributedDataParallel.__init__

    def _recording_init(self, module, *args, **kwargs):
        _init(self, module, *args, **kwargs)
        _wrapped.append(module)

    DistributedDataParallel.__init__ = _recording_init

    def _write(when):
        if _written:
            return
        _written.append(when)
        rank = int(os.environ.get("RANK", 0))
        info = {
            "when": when,
            "world_size": dist.get_world_size() if dist.is_initialized() else None,
            "wraps": len(_wrapped),
            "params": [[p.detach().cpu().double().flatten().tolist() for p in m.parameters()] for m in _wrapped],
        }
        with open(os.path.join(_DIR, f"rank{rank}.json"), "w") as f:
            json.dump(info, f)

    _destroy = dist.destroy_process_group

    def _destroy_process_group(*args, **kwargs):
        _write("destroy_process_group")
        return _destroy(*args, **kwargs)

    dist.destroy_process_group = _destroy_process_group
    atexit.register(_write, "exit")
'''

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
STEP_LINE = re.compile(r"\bstep\s+\d+")
# lines whose text (not only numbers) depends on the trained weights
DATA_DEPENDENT = {"custom_methods.py": [(re.compile(r"^sample \S+$"), "sample <text>")]}


def signature(line: str, name: str) -> str:
    """A line with its numbers (and any weight-dependent text) masked: what it says, not the values."""
    for pattern, replacement in DATA_DEPENDENT.get(name, []):
        line = pattern.sub(replacement, line)
    return NUMBER.sub("#", line)


def signatures(text: str, name: str) -> list[str]:
    return [signature(line, name) for line in text.splitlines()]


def collapsed(text: str, name: str) -> list[str]:
    """Signatures with each run of identical per-step lines folded into one."""
    out: list[str] = []
    for line in text.splitlines():
        sig = signature(line, name)
        if not (STEP_LINE.search(line) and out and out[-1] == sig):
            out.append(sig)
    return out


def step_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if STEP_LINE.search(line)]


def step_number(line: str) -> int:
    return int(STEP_LINE.search(line).group(0).split()[1])


def step_label(line: str) -> str:
    """`epoch 1 step 3` of `epoch 1 step 3 loss 0.5`: which step, not what it measured."""
    return re.split(r"\bloss\b", line)[0].strip()


def state_dicts(obj, where: str = "") -> dict[str, dict]:
    """Every dict of tensors inside a checkpoint (the model's state dict, also under "model")."""
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return {where: obj}
    found: dict[str, dict] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            found.update(state_dicts(value, f"{where}/{key}"))
    return found


def assert_same_checkpoint_layout(original: Path, converted: Path):
    """Same nested keys, shapes and dtypes as the original's: it loads into the original class."""
    before = state_dicts(torch.load(original, map_location="cpu"))
    after = state_dicts(torch.load(converted, map_location="cpu"))
    assert before, f"{original.name}: no state dict found"
    assert after.keys() == before.keys(), converted.name
    for where, state in after.items():
        assert not [k for k in state if str(k).startswith("module.")], f"{converted.name}{where}: `module.` prefix"
        assert list(state) == list(before[where]), f"{converted.name}{where}: keys differ"
        for key, tensor in state.items():
            assert (tensor.shape, tensor.dtype) == (before[where][key].shape, before[where][key].dtype), key


@dataclass
class Run:
    cwd: Path
    returncode: int
    stdout: str  # rank 0's under torchrun
    others: dict[int, str]  # the other ranks' stdout
    report: str  # for failure messages
    probes: dict[int, dict]


class Runs:
    """Runs of the original fixtures and of their snapshots as plain python (once per module each), and of
    converted scripts under torchrun, each in its own cwd."""

    def __init__(self, root: Path):
        self.root = root
        self.probe_path = root / "probe"
        self.probe_path.mkdir()
        (self.probe_path / "sitecustomize.py").write_text(PROBE)
        self._originals: dict[str, Run] = {}
        self._converted: dict[str, Run] = {}
        self._count = 0

    def fresh(self, label: str) -> Path:
        self._count += 1
        path = self.root / f"{self._count:03d}-{label}"
        path.mkdir()
        return path

    def original(self, script: Path) -> Run:
        if script.name not in self._originals:
            self._originals[script.name] = self.python(script, probe=False)
        return self._originals[script.name]

    def converted(self, script: Path) -> Run:
        """The snapshot of `script`'s conversion run as plain python (once per module, like the original)."""
        if script.name not in self._converted:
            self._converted[script.name] = self.python(EXPECTED_DIR / script.name)
        return self._converted[script.name]

    def _probe_env(self, probe_dir: Path, workers_only: bool) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(self.probe_path), os.environ.get("PYTHONPATH", "")) if p)
        return {"PYTHONPATH": path, "DDPIFY_PROBE_DIR": str(probe_dir), "DDPIFY_PROBE_WORKERS_ONLY": "1" if workers_only else "0"}

    @staticmethod
    def _probes(probe_dir: Path) -> dict[int, dict]:
        return {int(p.stem[4:]): json.loads(p.read_text()) for p in probe_dir.glob("rank*.json")}

    def python(self, script: Path, probe: bool = True, cwd: Path | None = None) -> Run:
        cwd = cwd or self.fresh(script.stem)
        probe_dir = self.fresh(script.stem + "-probe") if probe else None
        env = self._probe_env(probe_dir, workers_only=False) if probe_dir else None
        result = run_script(python_argv(script), cwd=cwd, env_extra=env, timeout=TIMEOUT)
        probes = self._probes(probe_dir) if probe_dir else {}
        return Run(cwd, result.returncode, result.stdout, {}, failure_report(result), probes)

    def torchrun(self, script: Path, cwd: Path | None = None) -> Run:
        cwd = cwd or self.fresh(script.stem + "-ddp")
        logs, probe_dir = self.fresh(script.stem + "-logs"), self.fresh(script.stem + "-probe")
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}",
                "--log-dir", str(logs), "--redirects", "1", str(script)]
        result = run_script(argv, cwd=cwd, env_extra=self._probe_env(probe_dir, workers_only=True), timeout=TIMEOUT)
        stdout = {int(p.parent.name): p.read_text() for p in logs.glob("*/attempt_*/*/stdout.log")}
        report = failure_report(result) + "".join(f"\n--- rank {r} stdout ---\n{out[-3000:]}" for r, out in sorted(stdout.items()))
        probes = self._probes(probe_dir)
        return Run(cwd, result.returncode, stdout.get(0, ""), {r: o for r, o in stdout.items() if r}, report, probes)



@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("ddp_runs"))


def assert_ddp_really_trained(run: Run, world_size: int):
    """Every rank wrapped its model in DDP inside a `world_size` group and ends with the same weights."""
    assert sorted(run.probes) == list(range(world_size)), f"probe files: {sorted(run.probes)}\n{run.report}"
    for rank, probe in run.probes.items():
        assert probe["world_size"] == world_size, f"rank {rank} left no process group of {world_size}: {probe['when']}"
        assert probe["wraps"] >= 1, f"rank {rank} never wrapped a model in DistributedDataParallel"
    for rank in range(1, world_size):
        assert run.probes[rank]["params"] == run.probes[0]["params"], f"rank {rank}'s weights differ from rank 0's"


def assert_same_files(original: Run, converted: Run, per_step_factor: float):
    written = written_files(converted.cwd)
    assert written == written_files(original.cwd), "the converted run writes other files than the original"
    for name in written:
        if name.endswith(CHECKPOINT_SUFFIXES):
            assert_same_checkpoint_layout(original.cwd / name, converted.cwd / name)
        elif name.endswith(TEXT_SUFFIXES):
            before, after = (original.cwd / name).read_text(), (converted.cwd / name).read_text()
            assert_same_report(before, after, name, per_step_factor, what=name)


def assert_same_report(original: str, converted: str, name: str, per_step_factor: float, what: str = "stdout"):
    """The converted output says what the original says, in order, with `factor` x its per-step lines."""
    assert collapsed(converted, name) == collapsed(original, name), f"{what}: different lines or order"
    before, after = step_lines(original), step_lines(converted)
    assert len(after) == int(len(before) * per_step_factor), f"{what}: {len(after)} per-step lines, original {len(before)}"
    labels = [step_label(line) for line in after]
    assert len(labels) == len(set(labels)), f"{what}: a step is reported twice"
    assert {step_number(line) for line in after} <= {step_number(line) for line in before}, f"{what}: steps the original never reaches"
    assert converted.splitlines()[-1:] and signature(converted.splitlines()[-1], name) == signature(original.splitlines()[-1], name)


# How many per-step log lines rank 0 prints under 2 ranks, relative to the original: each rank
# trains on half of every epoch, except where training is counted in steps, not epochs, or where the
# ranks share the rows of every batch no DataLoader feeds (each rank takes every step).
PER_STEP_FACTOR = {"step_based_iter.py": 1.0, "full_batch_regression.py": 1.0, "graph_node_masks.py": 1.0, "hand_sliced_batches.py": 1.0}
# Numbers that must not change under DDP: the evaluation still covers the full set, the curriculum
# the same subsets, the model the same size.
SAME_NUMBERS = {
    "validation_accuracy.py": r"\(\d+/(\d+)\)",
    "eval_only_after_train.py": r"over (\d+) samples",
    "loader_in_epoch_loop.py": r"using (\d+) samples",
    "custom_methods.py": r"vocab size (\d+) params (\d+)",
}

# Fixtures whose printed lines depend on the training trajectory, which two ranks change (the global
# batch doubles): eval_odd_size.py prints a line per new best and one when it stops early. That its
# metrics are exact is proven against an unsharded run of the same training in test_eval_shard.py.
TRAJECTORY_DEPENDENT_LINES = {"eval_odd_size.py"}

# Fixtures whose torchrun run shows a known codemod bug: {name: what goes wrong} (strict xfail).
TORCHRUN_BUGS: dict[str, str] = {}


@pytest.mark.parametrize("script", fixture_params(TORCHRUN_BUGS))
def test_runs_under_torchrun_on_two_ranks(script: Path, runs: Runs):
    original = runs.original(script)
    assert original.returncode == 0, original.report
    run = runs.torchrun(EXPECTED_DIR / script.name)
    assert run.returncode == 0, run.report
    assert run.others == {1: ""}, f"rank 1 printed:\n{run.others}"
    factor = PER_STEP_FACTOR.get(script.name, 1 / NPROC)
    if script.name not in TRAJECTORY_DEPENDENT_LINES:
        assert_same_report(original.stdout, run.stdout, script.name, factor)
    if script.name in SAME_NUMBERS:
        pattern = re.compile(SAME_NUMBERS[script.name])
        assert pattern.findall(run.stdout) == pattern.findall(original.stdout)
    assert_same_files(original, run, factor)
    assert_ddp_really_trained(run, NPROC)


# Under plain `python` the DistributedSampler draws its permutation from seed + epoch where the
# original RandomSampler draws from the global RNG: same data each epoch, another order. So the
# losses differ although the world-size-1 run is otherwise the same training (verified with
# shuffle=False on both sides). Strict: if ddpify ever keeps the order, these start passing.
SHUFFLE_ORDER = ("DistributedSampler(shuffle=True) visits the data in another order than the original's "
                 "RandomSampler, so a world-size-1 run's losses differ from the original's")
WORLD_SIZE_1_ORDER = {
    p.name: SHUFFLE_ORDER
    for p in FIXTURES
    if (EXPECTED_DIR / p.name).is_file() and "sampler=DistributedSampler(" in (EXPECTED_DIR / p.name).read_text()
}


@pytest.mark.parametrize("script", FIXTURES, ids=IDS)
def test_runs_as_plain_python_like_the_original(script: Path, runs: Runs):
    """World size 1: the same lines in the same order, the same files, checkpoints without `module.`."""
    with ThreadPoolExecutor(2) as pool:
        original = pool.submit(runs.original, script)
        converted = pool.submit(runs.converted, script)
        original, converted = original.result(), converted.result()
    assert original.returncode == 0, original.report
    assert converted.returncode == 0, converted.report
    assert signatures(converted.stdout, script.name) == signatures(original.stdout, script.name)
    assert_same_files(original, converted, per_step_factor=1.0)


@pytest.mark.parametrize("script", fixture_params(WORLD_SIZE_1_ORDER))
def test_plain_python_prints_exactly_what_the_original_prints(script: Path, runs: Runs):
    original = runs.original(script)
    converted = runs.converted(script)
    assert converted.returncode == 0, converted.report
    assert converted.stdout == original.stdout


def test_resuming_from_the_original_checkpoint_under_torchrun(runs: Runs):
    """checkpoint_resume: the DDP script resumes from what the single-GPU script saved (map_location, .module)."""
    script = BY_NAME["checkpoint_resume.py"]
    original = runs.original(script)
    assert (original.cwd / "checkpoint.pt").is_file(), original.report
    cwd = runs.fresh("resume")
    shutil.copy(original.cwd / "checkpoint.pt", cwd / "checkpoint.pt")
    run = runs.torchrun(EXPECTED_DIR / script.name, cwd=cwd)
    assert run.returncode == 0, run.report
    assert run.others == {1: ""}
    assert "resumed from epoch 1" in run.stdout.splitlines(), run.stdout
    assert not step_lines(run.stdout), "a finished run resumed and trained again"
    assert run.stdout.splitlines()[-1] == "done"


GLOBAL_BATCH = ["basic_main.py", "argparse_script.py", "grad_accumulation.py"]


@pytest.mark.parametrize("name", GLOBAL_BATCH)
def test_global_batch_size_is_split_over_the_ranks(name: str, runs: Runs):
    """--batch-size global: each rank loads batch_size // WORLD_SIZE, so rank 0 takes as many steps as one GPU."""
    script = BY_NAME[name]
    result = convert(script, "global")
    assert "// WORLD_SIZE" in result.output and "# ddpify: the global batch is split over WORLD_SIZE processes." in result.output
    assert any("batch_size -> batch_size // WORLD_SIZE" in c.message for c in result.changes)
    assert convert_source(result.output, "ddp", path=name).output == result.output
    converted = runs.fresh(script.stem + "-global-src") / script.name
    converted.write_text(result.output)
    original = runs.original(script)
    run = runs.torchrun(converted)
    assert run.returncode == 0, run.report
    assert run.others == {1: ""}
    assert_same_report(original.stdout, run.stdout, name, per_step_factor=1.0)
    assert_same_files(original, run, per_step_factor=1.0)
    assert_ddp_really_trained(run, NPROC)
