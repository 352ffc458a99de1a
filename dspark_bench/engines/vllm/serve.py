"""``python -m dspark_bench.engines.vllm.serve [--fix NAME[,NAME]] VLLM_ARGS...``: vLLM's OpenAI-compatible server
(``vllm.entrypoints.openai.api_server``) with known bugs of its build fixed (:mod:`.fixes`).

The fixes reach a server's processes as they reach the offline engine's: this launcher puts their names in the
environment the plugin reads (:func:`~.fixes.engine_env`), then becomes the server (``exec``: same process id, same
arguments, nothing else changed). Without ``--fix`` it is the server as shipped. vLLM must be installed with this
package (``make vllm-setup``), so that the plugin's entry point is registered.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from dspark_bench.engines.vllm.fixes import OPTION, engine_env, split_fixes

SERVER = "vllm.entrypoints.openai.api_server"


def split_args(argv: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """(fix names, the server's arguments): ``--fix A,B`` or ``--fix=A,B`` leading the arguments, once at most."""
    args, names = list(argv), ""
    if args and args[0].startswith(f"--{OPTION}="):
        names, args = args[0].split("=", 1)[1], args[1:]
    elif args and args[0] == f"--{OPTION}":
        if len(args) < 2:
            raise SystemExit(f"--{OPTION} needs a comma list of fix names")
        names, args = args[1], args[2:]
    fixes, _ = split_fixes({OPTION: names})
    return fixes, args


def main(argv: Sequence[str] | None = None) -> None:
    try:
        fixes, args = split_args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:  # an unknown fix name
        raise SystemExit(f"error: {exc}") from None
    env = {**os.environ, **engine_env(fixes)}
    os.execve(sys.executable, [sys.executable, "-m", SERVER, *args], env)


if __name__ == "__main__":
    main()
