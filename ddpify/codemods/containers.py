"""Code that wraps every model of a dict or list literal (`nets = {"enc": ..., "head": ...}`)."""

from __future__ import annotations

from typing import Callable


def wrap_each(name: str, container: str, wrap: Callable[[str], str]) -> str:
    """`nets = {key: WRAP(net) for key, net in nets.items()}`, or the list comprehension for a list."""
    if container == "dict":
        return f"{name} = {{key: {wrap('net')} for key, net in {name}.items()}}\n"
    return f"{name} = [{wrap('net')} for net in {name}]\n"
