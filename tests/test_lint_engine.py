"""The lint engine: selection, suppression comments, config, fixes, exit codes and the process pool."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.anatomy import Pos, ScriptKind
from ddpify.cli import cli
from ddpify.lint import engine
from ddpify.lint.config import Config, ConfigError, find_config, load_config
from ddpify.lint.engine import Options, RuleSet, check_text, fix_text
from ddpify.lint.fixes import apply_fixes
from ddpify.lint.rule import Edit, Finding, Fix, Rule

REPO_ROOT = Path(__file__).resolve().parents[1]
DDP_HEAD = "import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
BAD_LOAD = DDP_HEAD + "state = torch.load('ckpt.pt')\n"  # DDP001 on line 5
SINGLE_GPU = "import torch\n\nstate = torch.load('ckpt.pt')\n"


def lint(*args: str):
    """Run `ddpify lint ARGS` in-process, only DDP001 unless ARGS select; returns click's Result."""
    selection = () if "--select" in args or "--config" in args else ("--select", "DDP001")
    return CliRunner().invoke(cli, ["lint", *selection, *args])


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text) if text.startswith("\n") else text, encoding="utf-8")
    return path


def codes_on_lines(text: str) -> list[tuple[str, int]]:
    found, errors = check_text(text, "t.py", engine.rule_set(frozenset({"DDP001"})))
    assert not errors
    return [(d.code, d.pos.line) for d in found]


# ----- a few fake rules to drive the engine ------------------------------------------------------
class EveryLoad(Rule):
    """Flags every `torch.load` (in any kind of torch script)."""

    code, name, message = "DDP900", "every-load", "a load"
    applies_to = frozenset(ScriptKind)

    def check(self, anatomy):
        for site in anatomy.calls_to("torch.load"):
            yield Finding(site.pos)


class Crashes(Rule):
    """Raises."""

    code, name, message = "DDP901", "crashes", "never"
    applies_to = frozenset(ScriptKind)

    def check(self, anatomy):
        raise RuntimeError("boom")


class BreaksSyntax(Rule):
    """A fix that leaves invalid Python."""

    code, name, message = "DDP902", "breaks-syntax", "broken"
    applies_to = frozenset(ScriptKind)

    def check(self, anatomy):
        for site in anatomy.calls_to("torch.load"):
            yield Finding(site.pos, fix=Fix((Edit.replace(site.pos, "torch.load(("),), True, "break it"))


class OffByDefault(Rule):
    """Off unless selected by its exact code."""

    code, name, message = "DP950", "off-by-default", "off"
    applies_to = frozenset(ScriptKind)
    default_enabled = False


class TwoFixesOneSpot(Rule):
    """Two overlapping fixes on each torch.load: only one can be applied per round."""

    code, name, message = "DDP903", "two-fixes", "two"
    applies_to = frozenset(ScriptKind)

    def check(self, anatomy):
        for site in anatomy.calls_to("torch.load"):
            if "# done" not in anatomy.lines[site.pos.line - 1]:
                end = Edit.insert(site.pos.line, len(anatomy.lines[site.pos.line - 1]), "  # done")
                yield Finding(site.pos, fix=Fix((end,), True, "mark"))
                yield Finding(site.pos, fix=Fix((end,), True, "mark again"))


# ----- selection by kind --------------------------------------------------------------------------
def test_rules_only_run_on_the_kinds_they_apply_to():
    assert codes_on_lines(BAD_LOAD) == [("DDP001", 5)]
    assert codes_on_lines(SINGLE_GPU) == []


def test_a_crashing_rule_is_reported_and_the_others_still_run():
    found, errors = check_text(BAD_LOAD, "t.py", RuleSet([Crashes, EveryLoad]))
    assert [d.code for d in found] == ["DDP900"]
    assert errors == ["t.py: internal error in rule DDP901: RuntimeError: boom"]


# ----- suppression comments -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "comment",
    ["# ddpify: ignore[DDP001]", "# ddpify: ignore[DP003, DDP001]", "# ddpify: ignore", "# noqa: DDP001",
     "# noqa", "# NOQA:E501,DDP001", "# type: ignore  # ddpify:ignore[ddp001]"],
)
def test_suppression_comment_on_the_line(comment):
    assert codes_on_lines(DDP_HEAD + f"state = torch.load('ckpt.pt')  {comment}\n") == []


@pytest.mark.parametrize("comment", ["# ddpify: ignore[DDP002]", "# noqa: E501", "# ddpify ignore"])
def test_suppression_comment_for_other_codes_does_not_suppress(comment):
    assert codes_on_lines(DDP_HEAD + f"state = torch.load('ckpt.pt')  {comment}\n") == [("DDP001", 5)]


def test_suppression_on_the_last_line_of_a_multiline_statement():
    text = DDP_HEAD + "state = torch.load(\n    'ckpt.pt',\n)  # noqa: DDP001\n"
    assert codes_on_lines(text) == []


def test_suppression_inside_a_string_does_not_count():
    assert codes_on_lines(DDP_HEAD + "state = torch.load('# noqa')\n") == [("DDP001", 5)]


def test_comment_at_the_end_of_a_block_does_not_suppress_the_block():
    text = DDP_HEAD + "for p in paths:\n    state = torch.load(p)\n    print(p)  # noqa\n"
    assert codes_on_lines(text) == [("DDP001", 6)]


# ----- fixes --------------------------------------------------------------------------------------
def test_apply_fixes_skips_fixes_overlapping_earlier_ones():
    text = "abcdef\n"
    fixes = [
        Fix((Edit(1, 0, 1, 2, "X"),), True, "ab"),
        Fix((Edit(1, 1, 1, 3, "Y"),), True, "bc overlaps ab"),
        Fix((Edit(1, 4, 1, 4, "-"), Edit(1, 6, 1, 6, "!")), True, "two edits"),
    ]
    assert apply_fixes(text, fixes) == ("Xcd-ef!\n", 2)


def test_apply_fixes_counts_columns_in_characters():
    text = "s = 'é'; x = 1\n"
    assert apply_fixes(text, [Fix((Edit(1, 9, 1, 10, "y"),), True, "rename")]) == ("s = 'é'; y = 1\n", 1)


def test_overlapping_fixes_are_applied_over_several_rounds():
    text = DDP_HEAD + "a = torch.load('a')\nb = torch.load('b')\n"
    fixed, applied, left, _ = fix_text(text, "t.py", RuleSet([TwoFixesOneSpot]), Options(fix=True))
    assert fixed == DDP_HEAD + "a = torch.load('a')  # done\nb = torch.load('b')  # done\n"
    assert (applied, left) == (2, [])


def test_unsafe_fixes_need_unsafe_fixes():
    text = DDP_HEAD + "def f():\n    return torch.load('a')\n"  # no device in sight: unsafe "cpu" fix
    rules = engine.rule_set(frozenset({"DDP001"}))
    assert fix_text(text, "t.py", rules, Options(fix=True))[1] == 0
    fixed, applied, _, _ = fix_text(text, "t.py", rules, Options(fix=True, unsafe_fixes=True))
    assert applied == 1 and "torch.load('a', map_location=\"cpu\")" in fixed


def test_fix_that_breaks_syntax_is_refused(tmp_path, monkeypatch):
    path = write(tmp_path / "t.py", BAD_LOAD)
    monkeypatch.setattr(engine, "rule_set", lambda codes: RuleSet([BreaksSyntax]))
    report = engine.lint_file(str(path), Options(fix=True))
    assert path.read_text() == BAD_LOAD
    assert len(report.errors) == 1 and "after applying fixes of DDP902; file left unchanged" in report.errors[0]


def test_fix_is_not_written_when_the_file_changed_since_read(tmp_path, monkeypatch):
    path = write(tmp_path / "t.py", BAD_LOAD)
    monkeypatch.setattr(engine, "unchanged_since_read", lambda source: False)
    report = engine.lint_file(str(path), Options(fix=True, unsafe_fixes=True))
    assert path.read_text() == BAD_LOAD
    assert report.errors == [f"{path}: changed on disk while being fixed; not written"]


def test_fix_keeps_encoding_bom_and_mode(tmp_path):
    path = tmp_path / "t.py"
    path.write_bytes(b"\xef\xbb\xbf" + BAD_LOAD.replace("'ckpt.pt'", "'caf\xe9.pt'").encode("utf-8"))
    path.chmod(0o751)
    result = lint("--fix", "--unsafe-fixes", str(path))
    assert result.exit_code == 0, result.output
    data = path.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf") and "torch.load('café.pt', map_location=\"cpu\")" in data.decode("utf-8-sig")
    assert path.stat().st_mode & 0o777 == 0o751


def test_fix_via_cli_writes_and_reports(tmp_path):
    path = write(tmp_path / "t.py", DDP_HEAD + "device = torch.device('cuda', 0)\nstate = torch.load('a')\n")
    result = lint("--fix", str(path))
    assert result.exit_code == 0
    assert "state = torch.load('a', map_location=device)\n" in path.read_text()
    assert "1 fix applied" in result.stderr


def test_diff_shows_the_fix_without_writing(tmp_path):
    path = write(tmp_path / "t.py", DDP_HEAD + "device = torch.device('cuda', 0)\nstate = torch.load('a')\n")
    before = path.read_text()
    result = lint("--diff", str(path))
    assert result.exit_code == 1
    assert "-state = torch.load('a')\n+state = torch.load('a', map_location=device)\n" in result.stdout
    assert path.read_text() == before


# ----- files, errors and exit codes ---------------------------------------------------------------
def test_exit_codes_and_messages(tmp_path):
    clean = write(tmp_path / "clean.py", DDP_HEAD + "state = torch.load('a', map_location='cpu')\n")
    bad = write(tmp_path / "bad.py", BAD_LOAD)
    assert lint(str(clean)).exit_code == 0
    result = lint(str(bad))
    assert result.exit_code == 1
    assert result.stdout.startswith(f"{bad}:5:9: DDP001 torch.load() without map_location")
    assert "state = torch.load('ckpt.pt')\n" in result.stdout and "^^^^^^^^^^^^^^^^^^^^^" in result.stdout


def test_unparsable_file_exits_2_and_the_others_are_still_linted(tmp_path):
    write(tmp_path / "a_broken.py", "import torch\ndef f(:\n")
    write(tmp_path / "b_bad.py", BAD_LOAD)
    result = lint(str(tmp_path))
    assert result.exit_code == 2
    assert f"{tmp_path / 'a_broken.py'}:2: syntax error" in result.stderr
    assert "b_bad.py:5:9: DDP001" in result.stdout


def test_files_without_torch_are_not_parsed(tmp_path):
    write(tmp_path / "notes.py", "def f(:\n")
    result = lint(str(tmp_path))
    assert result.exit_code == 0
    assert "0 files scanned (1 without torch skipped)" in result.stderr


def test_missing_path_exits_2(tmp_path):
    result = lint(str(tmp_path / "nope.py"))
    assert result.exit_code == 2 and "nope.py" in result.stderr


def test_summary_line(tmp_path):
    write(tmp_path / "a.py", BAD_LOAD)
    write(tmp_path / "b.py", BAD_LOAD + "device = 'cuda:0'\nother = torch.load('b')\n")
    write(tmp_path / "c.py", "print('hello')\n")
    summary = lint(str(tmp_path)).stderr.strip().splitlines()[-1]
    assert summary.startswith(
        "ddpify: 2 files scanned (1 without torch skipped), 3 findings (DDP001: 3), "
        "1 fixable with --fix, 2 with --unsafe-fixes in "
    )


def test_parallel_results_match_serial_and_are_sorted(tmp_path):
    for i in range(24):
        write(tmp_path / f"d{i % 3}" / f"f{i:02}.py", BAD_LOAD if i % 2 else SINGLE_GPU)
    serial = lint("--jobs", "1", str(tmp_path))
    parallel = lint("--jobs", "2", str(tmp_path))
    assert serial.exit_code == parallel.exit_code == 1
    assert serial.stdout == parallel.stdout
    heads = [line for line in parallel.stdout.splitlines() if ": DDP001 " in line]
    assert len(heads) == 12 and heads == sorted(heads)


def test_every_fixture_lints_without_errors():
    result = lint("--jobs", "1", str(REPO_ROOT / "fixtures"))
    assert result.exit_code in (0, 1), result.stderr


# ----- configuration ------------------------------------------------------------------------------
def test_selection_by_most_specific_selector():
    rules = [EveryLoad, Crashes, OffByDefault]
    assert Config().enabled(rules, "x.py") == {"DDP900", "DDP901"}
    assert Config(select=("DP",)).enabled(rules, "x.py") == set()
    assert Config(select=("DP950",)).enabled(rules, "x.py") == {"DP950"}
    assert Config(extend_select=("DP950",)).enabled(rules, "x.py") == {"DDP900", "DDP901", "DP950"}
    assert Config(ignore=("DDP",)).enabled(rules, "x.py") == set()
    assert Config(select=("DDP900",), ignore=("DDP",)).enabled(rules, "x.py") == {"DDP900"}
    assert Config(select=("DDP",), ignore=("DDP90",)).enabled(rules, "x.py") == set()
    assert Config(select=("DDP9",), ignore=("DDP9",)).enabled(rules, "x.py") == set()


def test_per_file_ignores_match_relative_to_the_config(tmp_path):
    config = Config(per_file_ignores=(("tests/*.py", ("DDP9",)), ("legacy.py", ("DDP900",))), root=str(tmp_path))
    rules = [EveryLoad, Crashes]
    assert config.enabled(rules, str(tmp_path / "tests" / "t.py")) == set()
    assert config.enabled(rules, str(tmp_path / "src" / "legacy.py")) == {"DDP901"}
    assert config.enabled(rules, str(tmp_path / "src" / "t.py")) == {"DDP900", "DDP901"}


def test_config_is_found_walking_up_and_applied(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.ddpify]\nignore = ["DDP001"]\n')
    write(tmp_path / "sub" / "pyproject.toml", "[project]\nname = 'x'\n")  # no [tool.ddpify]: skipped
    bad = write(tmp_path / "sub" / "deep" / "bad.py", BAD_LOAD)
    assert find_config(bad) == (tmp_path / "pyproject.toml").resolve()
    assert lint(str(bad)).exit_code == 0
    assert lint("--ignore", "DP", str(bad)).exit_code == 1  # the flag replaces the config's ignore


def test_config_per_file_ignores_and_exclude(tmp_path):
    write(tmp_path / "pyproject.toml", textwrap.dedent("""
        [tool.ddpify]
        exclude = ["generated/"]
        [tool.ddpify.per-file-ignores]
        "old_*.py" = ["DDP001"]
    """))
    write(tmp_path / "generated" / "g.py", BAD_LOAD)
    write(tmp_path / "old_train.py", BAD_LOAD)
    assert lint(str(tmp_path)).exit_code == 0
    write(tmp_path / "train.py", BAD_LOAD)
    result = lint(str(tmp_path))
    assert result.exit_code == 1 and result.stdout.startswith(f"{tmp_path / 'train.py'}:5:9: DDP001")


def test_explicit_config_and_select_flag(tmp_path):
    config = write(tmp_path / "conf" / "pyproject.toml", '[tool.ddpify]\nselect = ["DP"]\n')
    bad = write(tmp_path / "bad.py", BAD_LOAD)
    assert lint(str(bad)).exit_code == 1
    assert lint("--config", str(config), str(bad)).exit_code == 0
    assert lint("--config", str(config), "--select", "ddp001", str(bad)).exit_code == 1


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[tool.ddpify]\nselect = 'DDP'\n", "select must be a list of strings"),
        ("[tool.ddpify]\nselect = ['XYZ1']\n", "unknown rule code or prefix 'XYZ1'"),
        ("[tool.ddpify\n", "invalid TOML"),
        ("[tool.ddpify]\nper-file-ignores = ['a']\n", "per-file-ignores must be a table"),
    ],
)
def test_bad_config_exits_2(tmp_path, toml, message):
    config = write(tmp_path / "pyproject.toml", toml)
    result = lint("--config", str(config), str(write(tmp_path / "a.py", BAD_LOAD)))
    assert result.exit_code == 2 and message in result.stderr
    with pytest.raises(ConfigError, match=message):
        load_config(config).validate([EveryLoad])


# ----- rules and rule ---------------------------------------------------------------------------
def test_rules_lists_every_rule():
    result = CliRunner().invoke(cli, ["rules"])
    assert result.exit_code == 0
    assert any(line.split()[:2] == ["DDP001", "torch-load-without-map-location"] for line in result.stdout.splitlines())


def test_rule_prints_its_docs():
    result = CliRunner().invoke(cli, ["rule", "ddp001"])
    assert result.exit_code == 0 and "### Why is this bad?" in result.stdout
    assert CliRunner().invoke(cli, ["rule", "XYZ999"]).exit_code == 2


def test_pos_columns_are_characters():
    text = DDP_HEAD + "é = 1; s = torch.load('a')\n"
    found, _ = check_text(text, "t.py", engine.rule_set(frozenset({"DDP001"})))
    assert found[0].pos == Pos(5, 11, 5, 26)
