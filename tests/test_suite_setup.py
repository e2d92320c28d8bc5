"""What tests/conftest.py sets up for the suite's processes."""

from __future__ import annotations

import os
import sys
import sysconfig

import pytest
import torch

from conftest import seed_with_installed_bytecode


def test_a_new_pycache_prefix_is_seeded_once_with_the_installed_bytecode(tmp_path, monkeypatch):
    """A process with a pycache prefix reads bytecode there only: a fresh clone's prefix must get the
    bytecode pip compiled for torch & co., or its first run compiles them again in every process."""
    package = os.path.dirname(torch.__file__)
    installed = os.path.join(package, "__pycache__", f"__init__.{sys.implementation.cache_tag}.pyc")
    if not os.path.exists(installed):
        pytest.skip("torch was installed without bytecode")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: dict.fromkeys(("stdlib", "purelib", "platlib"), package))
    prefix = tmp_path / "pycache"
    seed_with_installed_bytecode(str(prefix))
    linked = prefix / package.lstrip(os.sep) / os.path.basename(installed)
    assert os.path.samefile(linked, installed)
    linked.unlink()
    seed_with_installed_bytecode(str(prefix))
    assert not linked.exists(), "a seeded prefix is left as its runs made it"
