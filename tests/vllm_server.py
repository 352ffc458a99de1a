"""A real vLLM OpenAI server of the embedded target on 127.0.0.1 for the tests that need one, and the CLI in a
subprocess beside it (both with the CPU settings of ``make vllm-test``).

:func:`serve` starts a server on a free port, waits for it at most ``START_TIMEOUT_S`` seconds and stops it by its
process id (its whole process group) when the caller is done, also when the caller fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 300


def cpu_env() -> dict[str, str]:
    return {**os.environ, **{k: os.environ.get(k, v) for k, v in CPU_ENV.items()}, "PYTHONPATH": str(ROOT)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_dir() -> str:
    from dspark_bench.target.model import resolve_target

    return resolve_target("smollm2-135m")


def up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def serve(tmp_path: Path, speculative: str | None, dtype: str = "bfloat16", fixes: Sequence[str] = ()
          ) -> Iterator[str]:
    """Start a server (``speculative``: its --speculative-config JSON, with per-request detailed metrics; ``fixes``:
    started through :mod:`dspark_bench.engines.vllm.serve` with them); yield its base URL; stop it at the end."""
    port = free_port()
    launcher = ["-m", "dspark_bench.engines.vllm.serve", "--fix", ",".join(fixes)] if fixes else \
        ["-m", "vllm.entrypoints.openai.api_server"]
    args = [sys.executable, *launcher, "--model", model_dir(), "--served-model-name", "smol", "--dtype", dtype,
            "--max-model-len", "2048", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
    if speculative:
        args += ["--speculative-config", speculative, "--per-request-spec-decode-metrics", "detailed"]
    path = tmp_path / f"server-{port}.log"
    log = open(path, "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(args, env=cpu_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not up(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the vLLM server did not come up in {START_TIMEOUT_S} s (exit {proc.poll()}): "
                            f"{path.read_text()[-3000:]}")
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def cli(*args: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dspark_bench.cli.main", *args], env=cpu_env(), capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout_s)
