"""`ddpify convert --to accelerate`: the shape of the output on small inputs, and real runs.

Every top-level fixture (the set `--to ddp` converts) is converted with --to accelerate; each
complete conversion runs under torchrun on 2 CPU ranks (gloo; Accelerator() takes torchrun's
environment) through the tests' fork server, to its end, with a timeout (bench/run_converted.py's
launch, as tests/test_converted_runs.py makes them). A few are verified equivalent to the original.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import FIXTURES_DIR, child_environment, python_argv, run_ddpify, run_script  # noqa: E402
from test_converted_runs import bench, launcher  # noqa: E402

from ddpify.anatomy import ScriptKind, analyze  # noqa: E402
from ddpify.cli import cli  # noqa: E402
from ddpify.codemods.accelerate import runtime  # noqa: E402
from ddpify.codemods.ddp.rank_zero import SHARED_FROM_RANK_ZERO_HELPER  # noqa: E402
from ddpify.codemods.ddp.runtime import BROADCAST_CALL, EVALUATION_HELPERS, EVERY_CALL, MODEL_ROWS_CALL, ROWS_CALL, TENSORS_CALL  # noqa: E402
from ddpify.codemods.pipeline import Status  # noqa: E402
from ddpify.convert import convert_source  # noqa: E402
from ddpify.project_conversion import convert_entry  # noqa: E402
from ddpify.lint.engine import check_text, rule_set  # noqa: E402
from ddpify.lint.registry import all_rules  # noqa: E402

TOP_LEVEL = [entry for entry in bench.entries() if "/" not in entry.name]
PROJECTS = [entry for entry in bench.entries() if entry.folder is not None]  # fixtures/projects/ and fixtures/real/ folders


def convert(code: str, **options):
    return convert_source(textwrap.dedent(code), "accelerate", path="train.py", **options)


def flat(code: str) -> str:
    """The code without its layout (spaces, line breaks, trailing commas): width fitting may lay a statement out again."""
    return re.sub(r",(?=[)\]])", "", re.sub(r"\s+", "", code))


HEAD = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
"""
DATA = """\
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
"""


# ===== the shape of the output =================================================================
def test_a_plain_script_gets_one_accelerator_prepare_and_backward():
    result = convert(HEAD + """
def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
""" + DATA + """\
    model = nn.Linear(8, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
""")
    assert result.status is Status.CONVERTED, result.missing
    assert result.output == HEAD.replace("TensorDataset\n", "TensorDataset\nfrom accelerate import Accelerator, DataLoaderConfiguration\n") + """
accelerator = Accelerator(
    cpu=not torch.cuda.is_available(),
    dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
)

def main():
    device = accelerator.device
""" + DATA + """\
    model = nn.Linear(8, 2).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
        accelerator.print(f"epoch {epoch} loss {loss.item():.4f}")
"""


AMP = HEAD + """
def main():
    device = "cuda"
""" + DATA + """\
    model = nn.Linear(8, 2).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.cuda.amp.GradScaler()
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
"""


def test_a_model_trained_before_the_next_is_built_is_prepared_before_it_trains():
    result = convert(HEAD + """
def main():
""" + DATA + """\
    teacher = nn.Linear(8, 2)
    teacher_opt = torch.optim.SGD(teacher.parameters(), lr=0.1)
    for x, y in loader:
        teacher_opt.zero_grad()
        nn.functional.cross_entropy(teacher(x), y).backward()
        teacher_opt.step()
    student = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(student(x), teacher(x).detach()).backward()
        optimizer.step()
""")
    assert result.status is Status.CONVERTED, result.missing
    out = flat(result.output)
    teacher = out.index(flat("teacher, teacher_opt, loader = accelerator.prepare(teacher, teacher_opt, loader)"))
    student = out.index(flat("student, optimizer = accelerator.prepare(student, optimizer)"))
    assert teacher < out.index("forx,yinloader:") < out.index("student=nn.Linear") < student


def test_a_grad_scaler_becomes_accelerates_fp16():
    result = convert(AMP)
    assert result.status is Status.CONVERTED, result.missing
    out = result.output
    assert 'mixed_precision="fp16" if torch.cuda.is_available() else "no"' in out
    assert "scaler" not in out  # built, scaled, unscaled, stepped and updated: all Accelerate's now
    assert "accelerator.backward(loss)\n        accelerator.clip_grad_norm_(model.parameters(), 1.0)\n        optimizer.step()\n" in out
    assert 'with torch.autocast(device_type="cuda", dtype=torch.float16):' in out  # the same precision as Accelerate's


def test_a_bf16_autocast_gives_bf16():
    result = convert(AMP.replace("torch.float16", "torch.bfloat16").replace("    scaler = torch.cuda.amp.GradScaler()\n", "")
                     .replace("scaler.scale(loss).backward()", "loss.backward()").replace("        scaler.unscale_(optimizer)\n", "")
                     .replace("scaler.step(optimizer)", "optimizer.step()").replace("        scaler.update()\n", ""))
    assert 'mixed_precision="bf16" if torch.cuda.is_available() else "no"' in result.output


def test_a_scaler_saved_in_a_checkpoint_is_left_to_the_user():
    result = convert(AMP + '    torch.save({"scaler": scaler.state_dict()}, "amp.pt")\n')
    assert result.status is Status.INCOMPLETE
    assert any("GradScaler is read elsewhere" in m.what for m in result.missing)


ACCUMULATION = HEAD + """
def main():
""" + DATA + """\
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y) / 4
        loss.backward()
        if (i + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_accumulation_that_is_accelerates_own_runs_under_accumulate():
    result = convert(ACCUMULATION)
    assert result.status is Status.CONVERTED, result.missing
    assert ("    accelerator.gradient_accumulation_steps = 4\n    for i, (x, y) in enumerate(loader):\n"
            "        with accelerator.accumulate(model):\n"
            "            loss = nn.functional.cross_entropy(model(x), y)\n"  # accelerator.backward divides it by 4
            "            accelerator.backward(loss)\n        if (i + 1) % 4 == 0:\n") in result.output
    assert "no_sync" not in result.output


@pytest.mark.parametrize("change, why", [
    (("            optimizer.zero_grad()\n", "            optimizer.zero_grad()\n        print(loss.item())\n"), "the divided loss is also read (line 16)"),
    (("/ 4\n", "\n"), "the loss backpropagated is not divided by 4"),
    (("(i + 1) % 4 == 0", "i % 4 == 3"), "the step condition is not `(i + 1) % N == 0`"),
    (("            optimizer.zero_grad()\n", "            optimizer.zero_grad()\n        if i == 6:\n            break\n"), "break"),
])
def test_accumulation_accumulate_would_change_keeps_its_micro_steps_under_no_sync(change, why):
    result = convert(ACCUMULATION.replace(*change))
    assert result.status is Status.CONVERTED, result.missing
    assert "accelerator.no_sync(model)" in result.output and "accumulate" not in result.output
    assert any("not accelerator.accumulate(model)" in a.message and why in a.message for a in result.advice), result.advice


def test_evaluation_counted_over_rows_is_gathered_and_prints_the_single_process_metrics(tmp_path):
    """37 rows in batches of 8 on 2 processes: one process repeats a batch; gather_for_metrics drops the repeats."""
    source = FIXTURES_DIR / "accelerate" / "eval_gathered_metrics.py"
    result = convert(source.read_text())
    assert result.status is Status.CONVERTED, result.missing
    out = result.output
    assert "            logits, y = accelerator.gather_for_metrics((logits, y))\n            correct +=" in out
    assert "    val_loader = accelerator.prepare(val_loader)\n" in out and "probe_loader = accelerator.prepare" not in out
    assert flat("ddpify: evaluated on the whole set on every process (the metric of one process, no speed-up): "
                "`batch_means += criterion(logits, y).item()` adds a value per batch") in flat(out.replace("#", ""))  # a comment, laid out again
    assert lint(out) == []
    original = run_script(python_argv(source), tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / source.name).write_text(out)
    done = launcher(source.name, "accelerate")(bench.argv(tmp_path / "run" / source.name, "accelerate"), tmp_path / "run",
                                               child_environment(), 240)
    assert done is not None and done.returncode == 0, done and done.stderr[-2000:]
    before = [line for line in done.stdout.splitlines() if line.startswith("before")]  # the model as built: alike in both runs
    assert before == [line for line in original.stdout.splitlines() if line.startswith("before")]
    assert before[0].startswith("before accuracy 14/37 ")


EVALUATION = HEAD + """
def evaluate(model, loader):
    correct, seen, confusion, kept = 0, 0, torch.zeros(2, 2), []
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            pred = out.argmax(dim=1)
            correct += (pred == y).sum().item()
            seen += len(y)
            for t, p in zip(y.tolist(), pred.tolist()):
                confusion[t, p] += 1
            kept.append(pred)
    return correct / seen, confusion, kept


def main():
""" + DATA + """\
    val_loader = DataLoader(data, batch_size=16, shuffle=False)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    print(evaluate(model, val_loader))
"""


@pytest.mark.parametrize("change, why", [
    (("", ""), None),  # counts, a confusion matrix filled row by row, predictions kept: all over rows
    (("kept.append(pred)", "kept.append(nn.functional.cross_entropy(out, y))"), "collects a value per batch"),
    (("seen += len(y)", "seen += 1"), "`seen += 1` adds a value per batch"),
    (("confusion[t, p] += 1", "confusion[t, p] += nn.functional.cross_entropy(out, y).item()"), "adds a value per batch"),
    (("correct += (pred == y).sum().item()", "correct += nn.functional.cross_entropy(out, y).sum().item()"), "adds a value per batch"),
])
def test_evaluation_is_gathered_only_where_it_counts_over_rows(change, why):
    result = convert(EVALUATION.replace(*change))
    assert result.status is Status.CONVERTED, result.missing
    gathered = "out, y = accelerator.gather_for_metrics((out, y))" in result.output
    prepared = "val_loader = accelerator.prepare(val_loader)" in result.output
    assert gathered == prepared == (why is None)
    assert why is None or any(why in a.message for a in result.advice), result.advice


def test_a_loss_summed_over_the_batch_is_scaled_by_the_number_of_processes():
    result = convert(HEAD + """
def main():
""" + DATA + """\
    model = nn.Linear(8, 2)
    criterion = nn.CrossEntropyLoss(reduction="sum")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
""")
    assert "        accelerator.backward((loss * accelerator.num_processes))\n" in result.output


def test_full_batch_losses_are_shared_by_the_rows_of_each_process():
    result = convert((FIXTURES_DIR / "full_batch_regression.py").read_text())
    assert result.status is Status.CONVERTED, result.missing
    out = result.output
    assert flat("loss = loss_of_rank_rows(F.mse_loss, model(rows_of_rank(x)), rows_of_rank(y), rows=len(x))\naccelerator.backward(loss)") in flat(out)
    helper = out[out.index("def loss_of_rank_rows"):out.index("def main")]
    assert "accelerator.process_index" in flat(helper) and flat('whole = accelerator.reduce(whole, "sum")') in flat(helper)
    assert not re.search(r"\b(RANK|WORLD_SIZE|dist)\b", helper)  # the DDP target's names: undefined here
    assert out.index("accelerator = Accelerator(") < out.index("def loss_of_rank_rows")


@pytest.mark.parametrize("name, spelled_as", [
    (ROWS_CALL, "accelerator.process_index"), (MODEL_ROWS_CALL, "accelerator.process_index"),
    (EVERY_CALL, "agreed = accelerator.gather(agreed).min()"),  # a MIN all_reduce: the gathered flags' minimum
    (BROADCAST_CALL, "broadcast(value, from_process=0)"), (TENSORS_CALL, 'tensor.grad = accelerator.reduce(tensor.grad, "sum")'),
])
def test_the_ddp_helpers_have_an_accelerate_spelling(name, spelled_as):
    spelled = runtime.accelerator_spelling(EVALUATION_HELPERS[name])
    assert runtime.ddp_names_left(spelled) == [] and spelled_as in spelled
    assert runtime.ddp_names_left(EVALUATION_HELPERS[name])  # it had DDP names to spell


def test_the_stand_in_of_a_rank_zero_writer_reads_the_main_process_attributes():
    spelled = runtime.accelerator_spelling(SHARED_FROM_RANK_ZERO_HELPER)
    assert runtime.ddp_names_left(spelled) == [] and "setup_distributed" not in spelled
    assert "if accelerator.is_main_process:" in spelled and "broadcast_object_list(values, from_process=0)" in spelled
    assert runtime.broadcasts_used(spelled) == ["broadcast_object_list"]


def test_checkpoints_hold_the_unwrapped_model_and_load_onto_this_device():
    result = convert(HEAD + """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(x)

    def score(self, x):
        return self(x).sum()


def main():
""" + DATA + """\
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    torch.save(model.state_dict(), "net.pt")
    model.load_state_dict(torch.load("net.pt"))
    print(model.score(x))
""")
    assert result.status is Status.CONVERTED, result.missing
    out = result.output
    assert 'accelerator.save(accelerator.unwrap_model(model).state_dict(), "net.pt")\n' in out
    assert "accelerator.wait_for_everyone()  # the file rank 0 saved is read below\n" in out
    assert flat('accelerator.unwrap_model(model).load_state_dict(torch.load("net.pt", map_location=accelerator.device))') in flat(out)
    assert "accelerator.print(accelerator.unwrap_model(model).score(x))" in out


def test_other_output_runs_on_the_main_process():
    result = convert(HEAD + """import logging
from tqdm import tqdm


def main():
""" + DATA + """\
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in tqdm(loader):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        logging.info("loss %f", loss.item())
""")
    assert "tqdm(loader, disable=not accelerator.is_local_main_process)" in result.output
    assert '        if accelerator.is_main_process:\n            logging.info("loss %f", loss.item())\n' in result.output


def test_global_batch_splits_each_batch_over_the_processes():
    result = convert(HEAD + """
def main():
""" + DATA + """\
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
""", batch_size="global")
    assert flat("DataLoaderConfiguration(use_seedable_sampler=True, split_batches=True)") in flat(result.output)


LOADER_FROM_A_HELPER = HEAD + """
def make_loader(n):
    return DataLoader(TensorDataset(torch.randn(n, 8), torch.randint(0, 2, (n,))), batch_size=4)


def main():
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in make_loader(16):
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
"""


def test_a_loader_built_in_an_expression_is_prepared_where_it_is_built():
    result = convert(LOADER_FROM_A_HELPER)
    assert result.status is Status.CONVERTED, result.missing
    assert flat("return accelerator.prepare(DataLoader(TensorDataset(torch.randn(n, 8), torch.randint(0, 2, (n,))), batch_size=4))") \
        in flat(result.output)


def test_a_loader_call_that_builds_evaluation_loaders_too_is_incomplete():
    result = convert(LOADER_FROM_A_HELPER + """\
    with torch.no_grad():
        for x, y in make_loader(8):
            print(model(x).sum())
""")
    assert result.status is Status.INCOMPLETE
    assert [m.what for m in result.missing] == ["training loader not prepared: this DataLoader call builds evaluation loaders too"]


def convert_project(folder: Path, entry: str = "train.py") -> dict[str, object]:
    """Each file of the project converted --to accelerate (its entry and the modules it imports), by name."""
    return {job.path.relative_to(folder).as_posix(): job.result for job in convert_entry(folder / entry, "accelerate", {}).jobs}


def write_project(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def test_the_entry_hands_its_accelerator_to_the_modules_that_use_it():
    results = convert_project(FIXTURES_DIR / "projects" / "classic")
    assert all(r.status is not Status.INCOMPLETE for r in results.values()), {n: r.missing for n, r in results.items()}
    entry, utils = results["train.py"].output, results["utils.py"].output
    assert "\naccelerator: Accelerator | None = None\n" in utils and "accelerator.backward(loss)" in utils
    assert "\nimport utils\n" in entry
    built = entry.index("accelerator = Accelerator(")
    assert entry.index("\nutils.accelerator = accelerator\n") > built > entry.index("\nimport utils\n")
    assert "accelerator" not in results["model.py"].output  # a module that needs none is handed none
    # the loader data.py returns is prepared where the entry binds it
    assert flat("model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)") in flat(entry)


def test_a_module_that_uses_the_accelerator_when_imported_is_incomplete(tmp_path):
    folder = write_project(tmp_path, {"train.py": HEAD + """from steps import step


def main():
""" + DATA + """\
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        step(model, optimizer, x, y)


if __name__ == "__main__":
    main()
""", "steps.py": """\
import torch.nn as nn

print("steps loaded")


def step(model, optimizer, x, y):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
"""})
    results = convert_project(folder)
    assert [m.what for m in results["steps.py"].missing] == [
        "this module, which the entry script imports, uses `accelerator` when it is imported, before the entry has built it"]


def test_a_module_waiting_for_an_accelerator_the_entry_does_not_build_is_incomplete(tmp_path):
    folder = write_project(tmp_path, {"train.py": """\
def main():
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from steps import step
    loader = DataLoader(TensorDataset(torch.randn(16, 8), torch.randint(0, 2, (16,))), batch_size=4)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        step(model, optimizer, x, y)


if __name__ == "__main__":
    main()
""", "steps.py": """\
import torch.nn as nn


def step(model, optimizer, x, y):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
"""})
    results = convert_project(folder)
    assert "accelerator: Accelerator | None = None" in results["steps.py"].output
    assert [m.what for m in results["steps.py"].missing] == [
        "this module uses the accelerator of the entry script train.py, which builds none that ddpify could hand over"]


def test_an_item_of_the_loaders_another_file_returns_is_prepared_by_its_name(tmp_path):
    folder = write_project(tmp_path, {"train.py": HEAD + """from data import loaders


def main():
    train_loader, val_loader = loaders()
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in train_loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        print(sum(model(x).sum() for x, _ in val_loader))


if __name__ == "__main__":
    main()
""", "data.py": HEAD + """

def loaders():
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    return DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=16)
"""})
    results = convert_project(folder)
    assert results["train.py"].status is Status.CONVERTED, results["train.py"].missing
    assert flat("model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)") in flat(results["train.py"].output)
    assert results["data.py"].status is not Status.INCOMPLETE and "accelerator" not in results["data.py"].output


def test_converting_the_output_again_changes_nothing():
    once = convert((FIXTURES_DIR / "basic_main.py").read_text())
    again = convert(once.output)
    assert again.status is Status.NOTHING_TO_DO and again.output == once.output
    assert "already distributed by Accelerate" in again.note


def test_convert_writes_the_script_and_says_how_to_install_accelerate(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text((FIXTURES_DIR / "basic_main.py").read_text())
    monkeypatch.setattr(runtime, "accelerate_installed", lambda: False)
    result = CliRunner().invoke(cli, ["convert", str(script), "--to", "accelerate"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "train_accelerate.py").read_text() == convert(script.read_text()).output
    assert 'note: running it needs accelerate, which is not installed here: pip install "ddpify[accelerate]"' in result.output


def test_convert_says_nothing_of_installing_where_accelerate_is(tmp_path):
    script = tmp_path / "train.py"
    script.write_text((FIXTURES_DIR / "basic_main.py").read_text())
    result = CliRunner().invoke(cli, ["convert", str(script), "--to", "accelerate"], catch_exceptions=False)
    assert "launch: accelerate launch --num_processes=<GPUS>" in result.output and "note:" not in result.output


# ===== lint: the DDP rules that hold under Accelerate check its scripts =========================
DEFAULT_RULES = rule_set(frozenset(r.code for r in all_rules() if r.default_enabled))
ACCELERATE_RULES = [r.code for r in all_rules() if ScriptKind.ACCELERATE in r.applies_to]


def lint(code: str) -> list[tuple[str, int]]:
    findings, errors = check_text(code, "train.py", DEFAULT_RULES)
    assert not errors
    return [(f.code, f.pos.line) for f in findings]


def test_the_rules_that_check_accelerate_scripts():
    assert {"DDP001", "DDP002", "DDP006", "DDP007", "DDP009", "DDP012", "DDP013", "DDP020", "DDP021"} <= set(ACCELERATE_RULES)
    assert not {"DDP003", "DDP004", "DDP005"} & set(ACCELERATE_RULES)  # prepared loaders shard and reshuffle themselves


@pytest.mark.parametrize("entry", TOP_LEVEL, ids=[e.name for e in TOP_LEVEL])
def test_converted_fixture_lints_clean_under_the_rules_for_accelerate(entry):
    output = convert_source(entry.script.read_text(), "accelerate", path=entry.script.name).output
    assert analyze(output).kind is ScriptKind.ACCELERATE
    assert lint(output) == []


BUGGY = HEAD + """from accelerate import Accelerator


def main():
    accelerator = Accelerator()
""" + DATA + """\
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(nn.functional.cross_entropy(model(x), y))
        optimizer.step()
    if accelerator.is_main_process:
        accelerator.wait_for_everyone()
        print("saving")
    torch.save(accelerator.unwrap_model(model).state_dict(), "net.pt")
"""


def test_a_hand_written_accelerate_script_with_real_bugs_is_flagged():
    lines = BUGGY.splitlines()
    barrier = lines.index("        accelerator.wait_for_everyone()") + 1
    save = next(i for i, line in enumerate(lines, 1) if line.lstrip().startswith("torch.save("))
    assert lint(BUGGY) == [("DDP002", barrier), ("DDP006", save)]


def test_a_hand_written_accelerate_script_without_the_bugs_is_clean():
    fixed = BUGGY.replace("        accelerator.wait_for_everyone()\n", "").replace("    torch.save(", "    accelerator.save(")
    assert lint(fixed) == []


# ===== execution ===============================================================================
def test_top_level_fixtures_are_the_ddp_set():
    assert sorted(e.script for e in TOP_LEVEL) == sorted(p for p in FIXTURES_DIR.glob("*.py"))


@pytest.mark.parametrize("entry", TOP_LEVEL + PROJECTS, ids=[e.name for e in TOP_LEVEL + PROJECTS])
def test_converted_fixture_runs_to_the_end_on_two_ranks(entry, tmp_path):
    outcome = bench.run_one(entry, "accelerate", tmp_path, launcher(entry.name, "accelerate"))
    if outcome.status == "incomplete":
        pytest.skip(f"the conversion is incomplete: {outcome.detail}")
    assert outcome.status == "finished", bench.line(outcome)


# Each shape verify must see trained alike: plain, fp16 AMP handed to Accelerate, accumulation under
# no_sync, a checkpoint saved and loaded again, BatchNorm (each rank normalizes its own batches), a
# full batch of 101 rows whose loss the two processes share (51 and 50 rows, weighted); accumulation under
# accelerator.accumulate (fixtures/accelerate/): a partial last group stepped on (7 micro-steps per process),
# a divided loss whose division the backward takes over.
VERIFIED = ["basic_main.py", "amp_gradscaler.py", "grad_accumulation.py", "checkpoint_resume.py", "batchnorm_cnn.py",
            "full_batch_regression.py", "accelerate/accumulate_last_group.py", "accelerate/accumulate_divided_loss.py"]


@pytest.mark.parametrize("name", VERIFIED)
def test_conversion_verifies_equivalent(name, tmp_path):
    script = tmp_path / Path(name).name
    script.write_text((FIXTURES_DIR / name).read_text())
    assert "accelerator.accumulate(model)" in convert(script.read_text()).output or "accumulate" not in name
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(FIXTURES_DIR.parent), os.environ.get("PYTHONPATH")]))}
    done = run_ddpify(["verify", script.name, "--to", "accelerate", "--steps", "4"], tmp_path, env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("equivalent: 4 steps match"), done.stdout


@pytest.mark.parametrize("project", ["projects/classic", "real/trainer_project", "projects/trainer_package"])
def test_a_project_conversion_verifies_equivalent(project, tmp_path):
    """The entry prepares the loader another module returns (or the one it builds and hands to another
    module's Trainer: trainer_package) and hands its Accelerator to the modules that train (classic: a
    step function; the trainers: a Trainer class that prepares and saves)."""
    entry = next(e for e in PROJECTS if e.name == project)
    shutil.copytree(entry.folder, tmp_path / "project")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(FIXTURES_DIR.parent), os.environ.get("PYTHONPATH")]))}
    done = run_ddpify(["verify", entry.script.name, "--to", "accelerate", "--steps", "4"], tmp_path / "project", env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("equivalent: 4 steps match"), done.stdout


# Data no loader deals (ddpify.codemods.accelerate.own_data), each made the processes' own: batches drawn at
# random offsets (each process reseeded with its index once prepared), environments played (seeded per
# process, every step agreed: on_every_rank), an optimizer its agent owns (gradients averaged by hand), and
# a SummaryWriter the main process alone builds (a stand-in with its log_dir elsewhere) and a wandb run disabled elsewhere.
OWN_DATA = {"real/char_lm_nanogpt": "equivalent (statistical mode)", "real/rl_agent_owns_optimizer": "equivalent (statistical: each rank plays",
            "real/rl_dqn_replay": "equivalent (statistical: each rank plays", "projects/rank_zero_writers": "equivalent: 4 steps match"}


@pytest.mark.parametrize("name", OWN_DATA)
def test_data_no_loader_deals_converts_and_verifies_equivalent(name, tmp_path):
    entry = next(e for e in bench.entries([name]))
    if entry.folder is not None:
        shutil.copytree(entry.folder, tmp_path / "project")
    else:
        (tmp_path / "project").mkdir()
        shutil.copy(entry.script, tmp_path / "project")
    assert bench.conversion(entry, "accelerate")[0] == "converted", bench.conversion(entry, "accelerate")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(FIXTURES_DIR.parent), os.environ.get("PYTHONPATH")]))}
    done = run_ddpify(["verify", entry.script.name, "--to", "accelerate", "--steps", "4"], tmp_path / "project", env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(OWN_DATA[name]), done.stdout


@pytest.mark.parametrize("size, batch, split", [(64, 8, False), (45, 4, False), (45, 4, True)])
def test_verify_recuts_batches_as_accelerates_prepared_loaders_deal_them(size, batch, split):
    """The reference's step k holds what the ranks' prepared loaders (Accelerate's own prepare_data_loader)
    yield at their step k, for two epochs, also where the ranks repeat samples to even out the last step."""
    import torch
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader, TensorDataset

    from ddpify.verify.alignment import AcceleratedBatchSampler, LoaderCensus

    world, site = 2, ("train.py", 1)
    data = TensorDataset(torch.arange(size))
    torch.manual_seed(3)
    ranks = [prepare_data_loader(DataLoader(data, batch_size=batch, shuffle=True), num_processes=world, process_index=rank,
                                 split_batches=split, use_seedable_sampler=True) for rank in range(world)]
    reference = AcceleratedBatchSampler(site, size, batch, batch // world if split else batch, False, True, world,
                                        LoaderCensus({site}), lambda _: None, split=split)
    for _ in range(2):
        passes = [[batch[0] for batch in loader] for loader in ranks]  # each rank's whole pass, as each process makes it
        steps = [torch.cat(step).tolist() for step in zip(*passes)]
        assert list(reference) == steps
