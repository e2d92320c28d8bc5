"""What a conversion must achieve (wrap a model, shard the data): each `Duty` is named by the
transform that does it (`Transform.DUTY`), and a duty no transform fulfils leaves the result incomplete."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ddpify.anatomy import Anatomy


@dataclass(frozen=True)
class Duty:
    """What a conversion must achieve (wrap a model, shard the data); the transform that does it
    names it in `Transform.DUTY`, and a duty no transform fulfils leaves the result incomplete."""

    what: str  # said when it is not fulfilled
    todo: str
    anchor: Callable[[Anatomy], int]  # the line a missing item points at


def training_line(anatomy: Anatomy) -> int:
    """Where the script trains: its first optimizer, else its first backward()/step(), else line 1."""
    sites = anatomy.optimizers or anatomy.training_calls
    return sites[0].line if sites else 1


def wrap_duty(wrapper: str, ready: str, by_hand: str) -> Duty:
    """The duty of the transform that wraps each trained model in `wrapper` once it is `ready`."""
    return Duty(f"no model was wrapped in {wrapper} (found no model that an optimizer trains)",
                f"wrap the trained model by hand once it is {ready}: {by_hand}", training_line)


def data_line(anatomy: Anatomy) -> int:
    """Where the training data comes from: its first training loader, else any loader, else where it trains."""
    loaders = anatomy.train_loaders or anatomy.loaders
    return loaders[0].line if loaders else training_line(anatomy)
