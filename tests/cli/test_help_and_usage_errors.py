"""The command line called with nothing prints its help; real usage errors stay one line with exit status 2."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dspark_bench.cli.main import main


@pytest.mark.parametrize("args", [[], ["data"], ["baseline"]])
def test_a_group_called_with_nothing_prints_its_help(args):
    result = CliRunner().invoke(main, args, prog_name="dspark-bench")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: {' '.join(['dspark-bench', *args])} [OPTIONS] COMMAND")
    assert "Commands:" in result.output and "error:" not in result.output and len(result.output.splitlines()) > 5


@pytest.mark.parametrize(("args", "says"), [
    (["nosuch"], "No such command 'nosuch'"),
    (["-v"], "Missing command"),
    (["data", "vocab"], "Missing option '--data'"),
])
def test_usage_errors_are_one_line_and_exit_2(args, says):
    result = CliRunner().invoke(main, args, prog_name="dspark-bench")
    assert result.exit_code == 2
    assert result.output.startswith("error:") and len(result.output.strip().splitlines()) == 1, result.output
    assert says in result.output


@pytest.mark.parametrize(("args", "says"), [
    (["--top-p", "0"], "--top-p must be a number in (0, 1] (1: off), got 0.0"),
    (["--top-p", "1.5"], "--top-p must be a number in (0, 1]"),
    (["--top-p", "nan"], "--top-p must be a number in (0, 1] (1: off), got nan"),
    (["--top-k", "-1"], "--top-k must be an integer >= 0 (0: off), got -1"),
    (["--top-k", "2.5"], "'2.5' is not a valid integer"),
    (["--min-p", "1"], "--min-p must be a number in [0, 1) (0: off), got 1.0"),
    (["--min-p", "-0.1"], "--min-p must be a number in [0, 1)"),
    (["--temperature", "-1", "--top-k", "5"], "--temperature must be a finite number >= 0"),
])
@pytest.mark.parametrize("command", [["run", "--drafter", "none", "--engine", "vllm"], ["run", "--drafter", "none"],
                                     ["sweep"]])
def test_bad_sampling_filters_are_one_line_and_exit_2(tmp_path, command, args, says):
    """Refused before any engine, model or folder: the line names the option and what it accepts."""
    result = CliRunner().invoke(main, [*command, "--out", str(tmp_path / "out"), *args], prog_name="dspark-bench")
    assert result.exit_code == 2
    assert result.output.startswith("error:") and len(result.output.strip().splitlines()) == 1, result.output
    assert says in result.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "says"), [
    (["--target-path", "turbo"], "'turbo' is not one of 'auto', 'fast', 'fast-unpacked', 'fast-grouped', 'fast-sdpa', 'hf'"),
    (["--target-path", "fast", "--engine", "vllm"], "--target-path picks our engine's target forward"),
])
def test_bad_target_path_is_one_line_and_exit_2(tmp_path, args, says):
    result = CliRunner().invoke(main, ["run", "--drafter", "none", "--out", str(tmp_path / "out"), *args],
                                prog_name="dspark-bench")
    assert result.exit_code == 2
    assert result.output.startswith("error:") and len(result.output.strip().splitlines()) == 1, result.output
    assert says in result.output and not (tmp_path / "out").exists()
