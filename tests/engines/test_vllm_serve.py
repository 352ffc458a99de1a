"""``python -m dspark_bench.engines.vllm.serve``: the fixes named by ``--fix`` reach the server's environment (where
the plugin of :mod:`dspark_bench.engines.vllm.fixes` reads them) and every other argument reaches vLLM's server
unchanged; an unknown fix is refused. No vLLM needed: the ``exec`` is caught."""

from __future__ import annotations

import sys

import pytest

from dspark_bench.engines.vllm import serve
from dspark_bench.engines.vllm.fixes import ENV


@pytest.mark.parametrize(("argv", "fixes", "rest"), [
    (["--fix", "cpu-expand", "--model", "m"], ("cpu-expand",), ["--model", "m"]),
    (["--fix=cpu-expand", "--port", "1"], ("cpu-expand",), ["--port", "1"]),
    (["--model", "m", "--fix", "x"], (), ["--model", "m", "--fix", "x"]),  # only a leading --fix is ours
])
def test_leading_fixes_are_split_from_the_servers_arguments(argv, fixes, rest):
    assert serve.split_args(argv) == (fixes, rest)


def test_the_server_runs_with_the_fixes_in_its_environment(monkeypatch):
    seen = {}
    monkeypatch.setattr(serve.os, "execve", lambda path, args, env: seen.update(path=path, args=args, env=env))
    serve.main(["--fix", "cpu-expand", "--model", "m"])
    assert seen["args"] == [sys.executable, "-m", serve.SERVER, "--model", "m"] and seen["env"][ENV] == "cpu-expand"
    serve.main(["--model", "m"])
    assert seen["env"][ENV] == ""  # as shipped, whatever the caller's environment held


def test_an_unknown_fix_is_refused():
    with pytest.raises(SystemExit, match="unknown fix"):
        serve.main(["--fix", "cpu-expnad", "--model", "m"])
