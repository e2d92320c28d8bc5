"""gymnasium in the public corpus: the same made-up environments as the gym shim."""

from gym import Box, Discrete, Env, __version__, make  # noqa: F401
