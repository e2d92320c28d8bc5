"""verify re-cuts the reference's batches of two loaders DistributedSampler cannot deal (issue 27): one over an
IterableDataset and one with a sampler of the script's own (a WeightedRandomSampler with its generator).

For an Accelerate candidate the reference's step k joins what the ranks' prepared loaders give at their step k:
Accelerate's own prepare_data_loader runs on 2 gloo ranks and each rank's batches are compared with the
reference's re-cut (alignment.dispatched_steps, AcceleratedOwnSampler), short last batches included; then
`ddpify verify` says equivalent for each shape converted, and diverged for a port that does not prepare the
loader. The DDP converter leaves both loaders unsharded, so verify keeps their reference as it is (the verdict
says that every rank trained on the same data).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
from dealt_loaders import loader  # noqa: E402
from helpers import run_ddpify, run_script  # noqa: E402

from ddpify.convert import convert_source  # noqa: E402
from ddpify.verify.alignment import AcceleratedOwnSampler, LoaderCensus, dispatched_steps  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = Path(__file__).resolve().parent / "verify_cases" / "dealt"
DATA = Path(__file__).resolve().parent / "data"
TIMEOUT_S = 300
WORLD = 2
SITE = ("train.py", 1)

# name: (loader kind, samples (draws), batch, drop_last, split_batches)
LOADERS = {
    "stream, a short last batch alone in its step": ("stream", 41, 6, False, False),
    "stream, a short last batch after a full one": ("stream", 45, 4, False, False),
    "stream, drop_last": ("stream", 41, 6, True, False),
    "stream, split_batches": ("stream", 41, 6, False, True),
    "sampler, even_batches fills the last step": ("sampler", 30, 4, False, False),
    "sampler, drop_last": ("sampler", 30, 4, True, False),
    "sampler, split_batches": ("sampler", 30, 4, False, True),
}
PASSES = 2


@pytest.fixture(scope="module")
def ranks_saw(tmp_path_factory) -> list[dict]:
    """What each of 2 gloo ranks' prepared loaders gave, per loader of LOADERS: every pass's batches."""
    work = tmp_path_factory.mktemp("dealt")
    done = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
                       str(DATA / "dealt_loaders.py"), json.dumps(LOADERS), str(PASSES)], work, None, TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((work / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


def reference_steps(kind: str, count: int, batch: int, drop_last: bool, split: bool) -> list[list[list[int]]]:
    """The reference's re-cut batches, per pass, of the same loader built in this process."""
    own = loader(kind, count, batch, drop_last)
    if kind == "stream":
        group = 1 if split else WORLD
        return [[step[0].tolist() for step in dispatched_steps(own, WORLD, group, drop_last)] for _ in range(PASSES)]
    sampler = own.sampler
    reference = AcceleratedOwnSampler(SITE, len(sampler), batch, batch // WORLD if split else batch, drop_last, False, WORLD,
                                      LoaderCensus({SITE}), lambda _: None, split=split, sampler=sampler)
    return [[[own.dataset[i][0].item() for i in step] for step in reference] for _ in range(PASSES)]


@pytest.mark.parametrize("name", LOADERS)
def test_the_reference_step_joins_what_the_ranks_prepared_loaders_give(name, ranks_saw):
    joined = [[sum(steps, []) for steps in zip(*(rank[name][p] for rank in ranks_saw))] for p in range(PASSES)]
    assert all(len(rank[name][p]) == len(joined[p]) for rank in ranks_saw for p in range(PASSES))  # every rank as many steps
    assert reference_steps(*LOADERS[name]) == joined


def verify(*args: str, where: Path = CASES) -> dict:
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = run_ddpify(["verify", "--json", "--steps", "8", *args], where, env, TIMEOUT_S)
    assert done.stdout.startswith("{"), done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("script", ["stream.py", "weighted.py"])
def test_an_accelerate_conversion_verifies_equivalent_exactly(script):
    result = verify(script, "--to", "accelerate")
    assert (result["verdict"], result["mode"]) == ("equivalent", "exact"), result["message"]
    assert len(result["steps"]) == 8  # two passes: the second starts the stream, and the sampler's draws, again
    assert any(note.startswith(f"training loader at {script}:") for note in result["notes"]), result["notes"]


@pytest.mark.parametrize("script", ["stream.py", "weighted.py"])
def test_a_port_whose_processes_all_train_on_all_of_the_data_diverges(script, tmp_path):
    """The conversion with its loader left out of accelerator.prepare: every process trains on all of the data."""
    text = (CASES / script).read_text()
    port = convert_source(text, "accelerate", path=script).output
    prepared = "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)"
    assert prepared in port
    (tmp_path / script).write_text(text)
    (tmp_path / "port.py").write_text(port.replace(prepared, "model, optimizer = accelerator.prepare(model, optimizer)"))
    result = verify(script, "--to", "accelerate", "--against", "port.py", where=tmp_path)
    assert (result["verdict"], result["diverged_at"]) == ("diverged", 1), result["message"]


@pytest.mark.parametrize("script", ["stream.py", "weighted.py"])
def test_a_ddp_conversion_keeps_its_unsharded_reference(script):
    result = verify(script, "--to", "ddp")
    assert (result["verdict"], result["mode"]) == ("equivalent", "exact"), result["message"]
    assert result["message"].endswith("but every rank trained on the same data (see notes)"), result["message"]
    assert not any(note.startswith("training loader at") for note in result["notes"]), result["notes"]


def test_a_sampler_without_a_generator_is_left_alone_and_says_why(tmp_path):
    """Accelerate seeds a generator for it from the global one as the loader is prepared: no reference
    can draw that, so the reference keeps the script's own batches and the note says why."""
    script = (CASES / "weighted.py").read_text().replace(", generator=torch.Generator().manual_seed(1))", ")")
    assert "generator=" not in script
    (tmp_path / "unseeded.py").write_text(script)
    result = verify("unseeded.py", "--to", "accelerate", where=tmp_path)
    assert result["verdict"] == "diverged", result["message"]
    assert any(note.endswith("(Accelerate gives its sampler a generator seeded from the global one when the loader is prepared)")
               for note in result["notes"]), result["notes"]
    assert "were not re-cut" in result["message"]
