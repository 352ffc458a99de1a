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
