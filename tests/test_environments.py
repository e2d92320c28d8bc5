"""Reinforcement learning under DDP (issue 24 class 4): an environment per rank seeded with the rank,
and the tests around each optimizer step agreed over the ranks so that none waits for a step another
never makes. The fixtures fixtures/real/rl_*.py are run under torchrun by tests/test_real_corpus.py;
here, what the conversion writes and refuses, and a run showing the agreement is what keeps two
ranks whose episodes differ from hanging."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ddpify.codemods.pipeline import Status
from ddpify.convert import convert_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import ranks_alike, run_ddpify, run_script  # noqa: E402

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
RUN_TIMEOUT_S = 60

ENVIRONMENT = '''
import random
import torch
import torch.nn as nn


class Walk:
    def __init__(self):
        self.rng = random.Random()

    def reset(self, seed=None):
        if seed is not None:
            self.rng.seed(seed)
        self.t = 0
        return torch.zeros(4)

    def step(self, action):
        self.t += 1
        return torch.randn(4), 1.0, self.rng.random() < 0.2
'''

UPDATE_EVERY_STEP = ENVIRONMENT + '''

def main():
    env = Walk()
    env.reset(seed=1)
    net = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for episode in range(10):
        state, done = env.reset(), False
        while not done:
            loss = net(state).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            state, reward, done = env.step(0)


if __name__ == "__main__":
    main()
'''

AGENT_METHOD = ENVIRONMENT + '''

class Agent:
    def __init__(self):
        self.net = nn.Linear(4, 2)
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)

    def learn(self, state):
        loss = self.net(state).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()


def play(agent, env):
    for episode in range(10):
        state, done = env.reset(), False
        while not done:
            state, reward, done = env.step(0)
        agent.learn(state)


env = Walk()
play(Agent(), env)
'''

WARMUP_BUFFER = ENVIRONMENT + '''

def main():
    random.seed(0)
    torch.manual_seed(0)
    env = Walk()
    env.reset(seed=1)
    net = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    buffer = []
    for episode in range(20):
        state, done = env.reset(), False
        while not done:
            state, reward, done = env.step(0)
            buffer.append(state)
        if len(buffer) >= 30:
            loss = net(torch.stack(buffer[-8:])).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
'''

WORKERS = UPDATE_EVERY_STEP.replace("import random\n", "import random\nimport torch.multiprocessing as mp\n").replace(
    'if __name__ == "__main__":\n    main()', 'if __name__ == "__main__":\n    workers = [mp.Process(target=main) for _ in range(2)]')


def convert(text: str):
    return convert_source(text, "ddp", path="rl.py")


def test_each_rank_seeds_its_environment_and_agrees_on_leaving_the_episode_loop():
    result = convert((REAL / "rl_reinforce_corridor.py").read_text())
    assert result.status is Status.CONVERTED, result.missing
    assert "env.reset(seed=args.seed + RANK)" in result.output
    assert "if on_any_rank(running_reward > 0.9):" in result.output
    assert "policy = DDP(" in result.output
    assert any("statistically, not exactly, equivalent" in a.message for a in result.advice)


def test_an_update_that_waits_for_a_full_replay_buffer_waits_for_every_rank():
    result = convert((REAL / "rl_dqn_replay.py").read_text())
    assert result.status is Status.CONVERTED, result.missing
    assert "if on_every_rank(len(buffer) >= WARMUP):" in result.output
    assert "env.reset(seed=0 + RANK)" in result.output
    assert "target.load_state_dict(q.module.state_dict())" in result.output
    assert "while not done:" in result.output  # the loop over one episode's steps is each rank's own


@pytest.mark.parametrize("text, why", [
    (UPDATE_EVERY_STEP, "inside the loop over an episode's environment steps"),
    (AGENT_METHOD, "called from where ddpify can't follow"),
    (WORKERS, "worker processes"),
], ids=["update-every-step", "agent-method", "a3c-workers"])
def test_uneven_steps_and_own_workers_are_incomplete_with_the_recipe(text: str, why: str):
    result = convert(text)
    assert result.status is Status.INCOMPLETE
    assert any(why in m.what and "env.reset(seed=seed + RANK)" in m.todo for m in result.missing), result.missing


def test_ranks_whose_episodes_differ_finish_only_because_they_agree(tmp_path: Path):
    """The converted script finishes on 2 ranks; the same output with the agreement taken out does
    not: rank 1's buffer (seed 2) fills two episodes before rank 0's (seed 1), so it makes two
    updates rank 0 never makes, and waits in their all_reduce."""
    converted = convert(WARMUP_BUFFER).output
    unagreed = converted.replace("if on_every_rank(len(buffer) >= 30):", "if len(buffer) >= 30:")
    assert unagreed != converted
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "rl.py"]
    outcomes = {}
    for name, text in (("agreed", converted), ("unagreed", unagreed)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rl.py").write_text(text)
        try:
            outcomes[name] = run_script(torchrun, tmp_path / name, timeout=RUN_TIMEOUT_S).returncode
        except AssertionError:  # run_script kills a run past its timeout: a hang
            outcomes[name] = "hung"
    assert outcomes["agreed"] == 0
    assert outcomes["unagreed"] != 0


def test_verify_says_statistically_equivalent_and_why(tmp_path: Path):
    """verify cannot compare an episode's loss with the reference's: it checks the ranks step alike and
    hold the same parameters, and says so, instead of 'diverged' at step 1."""
    script = tmp_path / "rl_dqn_replay.py"
    script.write_text((REAL / "rl_dqn_replay.py").read_text())
    done = run_ddpify(["verify", script.name, "--to", "ddp", "--json"], tmp_path, timeout=300)
    result = json.loads(done.stdout[done.stdout.index("{"):])
    assert (result["verdict"], result["mode"]) == ("equivalent", "statistical"), result["message"]
    assert "each rank plays its own episodes" in result["message"] and "held the same parameters" in result["message"]


# ----- a model that owns its optimizer: gradients averaged by hand ------------------------------

OWNS_OPTIMIZER = REAL / "rl_agent_owns_optimizer.py"
AVERAGES = ("        average_gradients(self.optimizer)\n", "        average_gradients(self.temperature_optimizer)\n")
SAVED_ON_RANK_ZERO = '    if RANK == 0:\n        torch.save(agent.state_dict(), "agent.pt")\n'

CRITICS_UNPACKED = ENVIRONMENT + '''

class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.parameters(), lr=0.1)

    def learn(self, state):
        loss = self.fc(state).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()


def main():
    torch.manual_seed(0)
    env = Walk()
    q1, q2 = Critic(), Critic()
    for episode in range(10):
        state, done = env.reset(seed=episode), False
        while not done:
            state, reward, done = env.step(0)
        for _ in range(3):
            q1.learn(state)
            q2.learn(state)


if __name__ == "__main__":
    main()
'''

OWNED_EVERY_HORIZON = CRITICS_UNPACKED.replace('''        while not done:
            state, reward, done = env.step(0)
        for _ in range(3):
            q1.learn(state)
            q2.learn(state)''', '''        while not done:
            for t in range(5):
                state, reward, done = env.step(0)
                if done:
                    break
            q1.learn(state)''')

OWNED_WITH_CLOSURE = CRITICS_UNPACKED.replace("self.optimizer.step()", "self.optimizer.step(lambda: loss)")


def test_an_optimizer_its_model_owns_is_averaged_by_hand_after_the_last_backward():
    result = convert(OWNS_OPTIMIZER.read_text())
    assert result.status is Status.CONVERTED, result.missing
    assert "DDP(" not in result.output
    assert "        self.optimizer = torch.optim.Adam(self.parameters(), lr=lr)\n        broadcast_parameters(self.optimizer)\n" in result.output
    assert "        broadcast_parameters(self.temperature_optimizer)\n" in result.output
    averaged_then_clipped = "            loss.backward()\n" + "".join(AVERAGES) + "        nn.utils.clip_grad_norm_("
    assert averaged_then_clipped in result.output  # the clip sees averaged gradients, as under DDP
    assert "if on_every_rank(played >= args.warmup):" in result.output
    assert SAVED_ON_RANK_ZERO in result.output


def test_methods_called_on_each_of_an_unpacked_pair_are_followed():
    result = convert(CRITICS_UNPACKED)
    assert result.status is Status.CONVERTED, result.missing
    assert result.output.count("average_gradients(self.optimizer)") == 1


@pytest.mark.parametrize("text, why", [
    (OWNED_EVERY_HORIZON, "inside the loop over an episode's environment steps"),
    (OWNED_WITH_CLOSURE, "given a closure"),
], ids=["update-every-horizon", "closure"])
def test_an_owned_optimizer_that_could_step_unevenly_or_unaveraged_is_incomplete(text: str, why: str):
    result = convert(text)
    assert result.status is Status.INCOMPLETE
    assert any(why in m.what for m in result.missing), result.missing
    assert not any("was not found" in m.what for m in result.missing), result.missing


def test_an_owned_optimizer_averaged_by_hand_trains_exactly_as_the_original_on_one_process(tmp_path: Path):
    """Under plain `python` (world size 1) the broadcast and the average change no number: the same
    prints and the same saved parameters, byte for byte."""
    outputs = {}
    for name, text in (("original", OWNS_OPTIMIZER.read_text()), ("converted", convert(OWNS_OPTIMIZER.read_text()).output)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rl.py").write_text(text)
        done = run_script([sys.executable, "rl.py"], tmp_path / name, timeout=RUN_TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        outputs[name] = done.stdout, (tmp_path / name / "agent.pt").read_bytes()
    assert outputs["converted"] == outputs["original"]


def test_two_ranks_hold_the_same_parameters_only_because_gradients_are_averaged(tmp_path: Path):
    """Each rank saves its parameters after training: alike with the averages, apart without them
    (the ranks play other episodes)."""
    converted = convert(OWNS_OPTIMIZER.read_text()).output.replace(
        SAVED_ON_RANK_ZERO, '    torch.save(agent.state_dict(), f"agent{RANK}.pt")\n')
    unaveraged = converted.replace(AVERAGES[0], "").replace(AVERAGES[1], "")
    assert "agent{RANK}.pt" in converted and "average_gradients(self" not in unaveraged
    alike = ranks_alike(tmp_path, {"averaged": converted, "unaveraged": unaveraged}, "agent{RANK}.pt", RUN_TIMEOUT_S)
    assert alike == {"averaged": True, "unaveraged": False}
