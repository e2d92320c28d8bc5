"""The wheel ships every package: the explicit list in pyproject.toml must match the tree."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "ddpify").rglob("__init__.py")}
    assert on_disk <= listed
    assert config["package-dir"]["ddpify.rules"] == "rules"
    assert (ROOT / "rules" / "__init__.py").exists()


def test_rules_ship_inside_ddpify_not_as_a_top_level_package():
    import ddpify.rules

    assert Path(ddpify.rules.__file__).resolve().parent == ROOT / "rules"
