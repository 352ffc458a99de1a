"""Run model-generated Python in a constrained child process. THIS EXECUTES UNTRUSTED CODE.

What protects the machine, exactly (layers, outermost first):

1. **Network namespace** (kernel-enforced) when ``unshare -rn`` works on this host (probed once per process):
   the child runs in a new user + network namespace that has no interface but a down loopback, so no
   connection of any kind (internet or localhost) can be made.
2. **Audit hook** (always; Python-level, a tripwire and not a security boundary): before the program runs, a
   ``sys.addaudithook`` hook refuses socket creation/connection/DNS, new processes (``subprocess``,
   ``os.system``, ``os.exec*``, ``os.fork``, ``os.posix_spawn``), ``ctypes``, and writes, renames or deletions
   outside the working directory. Code calling native libraries (e.g. a C extension already installed) can get
   around it; layer 1 is what stops the network then.
3. **Resource limits** set in ``preexec_fn``: address space (``RLIMIT_AS``), CPU seconds (``RLIMIT_CPU``),
   file size (``RLIMIT_FSIZE``), no core files, and ``RLIMIT_NPROC`` = 0 extra processes for non-root users
   (root ignores it; layer 2 covers process creation then).
4. **Wall-clock timeout**: the whole process group is killed after ``timeout_s``.
5. **Isolation of the interpreter**: ``python -I -B`` (no environment variables, user site or bytecode
   writes), a minimal environment without proxy settings, and a fresh temporary working directory that is
   deleted afterwards.

Not protected: reading files the user can read, and CPU/memory use within the limits above. Run untrusted
evaluations in a container or VM when that matters.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_GUARD = r'''
import os, sys
_ROOT = os.path.realpath(os.getcwd())
_NET = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
        "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg"}
_PROC = {"subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty",
         "os.startfile", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata"}
_PATHS = {"os.remove", "os.rmdir", "os.rename", "os.truncate", "shutil.rmtree", "os.chmod", "os.chown",
          "os.mkdir", "os.symlink", "os.link"}

def _inside(path):
    try:
        return os.path.realpath(os.fspath(path)).startswith(_ROOT + os.sep)
    except TypeError:
        return False  # a file descriptor or something odd: refuse

def _writes(mode, flags):
    if isinstance(mode, str):
        return bool(set(mode) & set("wax+"))
    return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))

def _hook(event, args):
    if event in _NET or event in _PROC:
        raise PermissionError(f"sandbox: {event} is blocked")
    if event == "import" and args[0] in ("ctypes", "_ctypes"):
        raise PermissionError("sandbox: ctypes is blocked")
    if event == "open" and _writes(args[1], args[2]) and not _inside(args[0]):
        raise PermissionError(f"sandbox: writing {args[0]!r} outside the working directory is blocked")
    if event in _PATHS and not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
        raise PermissionError(f"sandbox: {event} outside the working directory is blocked")

sys.addaudithook(_hook)
del _hook
with open("program.py", encoding="utf-8") as _fh:
    _code = compile(_fh.read(), "program.py", "exec")
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
'''


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock, per program
    memory_mb: int = 2048  # RLIMIT_AS
    file_mb: int = 16  # RLIMIT_FSIZE


@dataclass(frozen=True)
class ExecResult:
    status: str  # "passed", "failed" or "timeout"
    returncode: int | None
    output: str  # the tail of stdout + stderr

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@functools.cache
def warn_once() -> None:
    """Log, once per process, that model code is about to be executed."""
    log.warning(
        "executing model-generated code for HumanEval scoring (sandbox: %s; audit hook; rlimits; timeout). "
        "Run untrusted evaluations in a container or VM.",
        "network namespace via 'unshare -rn'" if network_namespace_available() else "NO network namespace",
    )


@functools.cache
def network_namespace_available() -> bool:
    """Whether ``unshare -rn`` can create a user + network namespace here (probed once)."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        done = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _limit(limits: Limits):
    """preexec_fn for the child (runs after fork, before exec)."""

    def apply() -> None:
        memory = limits.memory_mb * 2**20
        cpu = int(limits.timeout_s) + 1
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * 2**20,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if os.getuid() != 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))

    return apply


def command() -> list[str]:
    """The child's command line (without the working directory, which is the cwd)."""
    python = [sys.executable, "-I", "-B", "guard.py"]
    return ["unshare", "-rn", *python] if network_namespace_available() else python


def run_program(program: str, limits: Limits = Limits()) -> ExecResult:
    """Execute ``program`` once under the protections of the module docstring; passed iff it exits with 0."""
    warn_once()
    with tempfile.TemporaryDirectory(prefix="dspark-exec-") as tmp:
        Path(tmp, "program.py").write_text(program, encoding="utf-8")
        Path(tmp, "guard.py").write_text(_GUARD, encoding="utf-8")
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "no_proxy": "*", "NO_PROXY": "*"}
        proc = subprocess.Popen(
            command(), cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, preexec_fn=_limit(limits), start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, _ = proc.communicate()
            return ExecResult("timeout", None, _tail(out))
    status = "passed" if proc.returncode == 0 else "failed"
    return ExecResult(status, proc.returncode, _tail(out))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session: kill everything it started
    except ProcessLookupError:
        pass


def _tail(out: bytes | None, n: int = 2000) -> str:
    return (out or b"")[-n:].decode("utf-8", errors="replace")
