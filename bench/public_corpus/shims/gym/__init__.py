"""A stand-in for gym / gymnasium in the public corpus: CartPole-v1 and Pendulum-v1 with the classic
dynamics, seeded, no rendering (render() does nothing). gym cannot be assumed installed here, and the
corpus measures the conversion, not the environment.

The API is gym >= 0.26's (reset() -> (obs, info); step() -> (obs, reward, terminated, truncated,
info)); DDPIFY_CORPUS_GYM_API=old gives the pre-0.26 one (reset() -> obs; step() -> 4 values) for
scripts written against it."""

from __future__ import annotations

import math
import os

import numpy as np

__version__ = "0.0+ddpify-corpus-shim"


def _old_api() -> bool:
    return os.environ.get("DDPIFY_CORPUS_GYM_API", "new") == "old"


class Discrete:
    def __init__(self, n: int, rng: np.random.Generator):
        self.n, self.shape, self._rng = n, (), rng

    def sample(self) -> int:
        return int(self._rng.integers(self.n))


class Box:
    def __init__(self, low, high, shape, rng: np.random.Generator):
        self.low = np.broadcast_to(np.asarray(low, dtype=np.float32), shape).copy()
        self.high = np.broadcast_to(np.asarray(high, dtype=np.float32), shape).copy()
        self.shape, self._rng = shape, rng

    def sample(self) -> np.ndarray:
        return self._rng.uniform(self.low, self.high).astype(np.float32)


class Spec:
    def __init__(self, name: str, threshold: float, max_steps: int):
        self.id, self.reward_threshold, self.max_episode_steps = name, threshold, max_steps


class Env:
    """The shared episode bookkeeping: time limit, seeding, both step APIs."""

    def __init__(self, spec: Spec, max_episode_steps: int | None = None):
        self.spec = spec
        self.max_steps = max_episode_steps or spec.max_episode_steps
        self.np_random = np.random.default_rng(0)
        self.unwrapped, self.elapsed = self, 0

    def seed(self, seed=None):
        self.np_random = np.random.default_rng(seed)
        return [seed]

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.seed(seed)
        self.elapsed = 0
        observation = self._reset()
        return observation if _old_api() else (observation, {})

    def step(self, action):
        observation, reward, terminated = self._step(action)
        self.elapsed += 1
        truncated = self.elapsed >= self.max_steps
        if _old_api():
            return observation, reward, terminated or truncated, {}
        return observation, reward, terminated, truncated, {}

    def render(self, *args, **kwargs):
        return None

    def close(self):
        return None


class CartPole(Env):
    gravity, cart_mass, pole_mass, half_length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_threshold_radians, x_threshold = 12 * 2 * math.pi / 360, 2.4  # gym's names (reward shaping reads them)

    def __init__(self, max_episode_steps=None, **_):
        super().__init__(Spec("CartPole-v1", 475.0, 500), max_episode_steps)
        self.action_space = Discrete(2, self.np_random)
        high = np.array([4.8, np.inf, 0.42, np.inf], dtype=np.float32)
        self.observation_space = Box(-high, high, (4,), self.np_random)

    def _reset(self):
        self.state = self.np_random.uniform(-0.05, 0.05, 4)
        return self.state.astype(np.float32)

    def _step(self, action):
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if int(action) == 1 else -self.force_mag
        total = self.cart_mass + self.pole_mass
        temp = (force + self.pole_mass * self.half_length * theta_dot ** 2 * math.sin(theta)) / total
        theta_acc = (self.gravity * math.sin(theta) - math.cos(theta) * temp) / (
            self.half_length * (4.0 / 3.0 - self.pole_mass * math.cos(theta) ** 2 / total))
        x_acc = temp - self.pole_mass * self.half_length * theta_acc * math.cos(theta) / total
        self.state = np.array([x + self.tau * x_dot, x_dot + self.tau * x_acc,
                               theta + self.tau * theta_dot, theta_dot + self.tau * theta_acc])
        done = abs(self.state[0]) > self.x_threshold or abs(self.state[2]) > self.theta_threshold_radians
        return self.state.astype(np.float32), 1.0, bool(done)


class Pendulum(Env):
    max_speed, max_torque, dt, g, m, length = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0

    def __init__(self, max_episode_steps=None, **_):
        super().__init__(Spec("Pendulum-v1", -200.0, 200), max_episode_steps)
        self.action_space = Box(-self.max_torque, self.max_torque, (1,), self.np_random)
        self.observation_space = Box(-8.0, 8.0, (3,), self.np_random)

    def _observation(self):
        theta, speed = self.state
        return np.array([math.cos(theta), math.sin(theta), speed], dtype=np.float32)

    def _reset(self):
        self.state = self.np_random.uniform([-math.pi, -1.0], [math.pi, 1.0])
        return self._observation()

    def _step(self, action):
        theta, speed = self.state
        torque = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -self.max_torque, self.max_torque))
        angle = ((theta + math.pi) % (2 * math.pi)) - math.pi
        cost = angle ** 2 + 0.1 * speed ** 2 + 0.001 * torque ** 2
        speed = float(np.clip(speed + (3 * self.g / (2 * self.length) * math.sin(theta) + 3.0 / (self.m * self.length ** 2) * torque) * self.dt,
                              -self.max_speed, self.max_speed))
        self.state = np.array([theta + speed * self.dt, speed])
        return self._observation(), -cost, False


ENVIRONMENTS = {"CartPole-v0": CartPole, "CartPole-v1": CartPole, "Pendulum-v0": Pendulum, "Pendulum-v1": Pendulum}


def make(name: str, **kwargs) -> Env:
    if name not in ENVIRONMENTS:
        raise ValueError(f"ddpify corpus gym shim: no made-up environment {name!r} (only {', '.join(ENVIRONMENTS)})")
    return ENVIRONMENTS[name](**kwargs)
