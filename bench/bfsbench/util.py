"""Small helpers: logging, sizes, timed command execution with peak-RSS accounting."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional

_T0 = time.monotonic()
VERBOSE = False


def log(msg: str) -> None:
    el = time.monotonic() - _T0
    print(f"[bench {el:7.1f}s] {msg}", file=sys.stderr, flush=True)


def debug(msg: str) -> None:
    if VERBOSE:
        log(msg)


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3}


def parse_size(text: str | int) -> int:
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"bad size {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def fmt_size(n: Optional[float]) -> str:
    if n is None:
        return "—"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def fmt_secs(s: Optional[float]) -> str:
    if s is None:
        return "—"
    if s < 0.001:
        return f"{s * 1e6:.0f} µs"
    if s < 0.01:
        return f"{s * 1000:.2f} ms"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 100:
        return f"{s:.2f} s"
    return f"{s:.0f} s"


def _proc_counter(pid: int, file: str, field: str) -> Optional[int]:
    """The number after `field:` in /proc/PID/FILE (`status`, `io`)."""
    try:
        with open(f"/proc/{pid}/{file}") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def read_status_kb(pid: int, field: str) -> Optional[int]:
    return _proc_counter(pid, "status", field)


def cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU time of a process, all its threads, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()   # from the state, field 3
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def io_bytes(pid: int, field: str) -> Optional[int]:
    """A counter of /proc/PID/io, e.g. `wchar`: bytes the process wrote, sockets included."""
    return _proc_counter(pid, "io", field)


def disk_bytes(root) -> int:
    """Bytes a directory tree takes on disk, as `du -s` counts them (allocated blocks: a sparse
    file counts what it holds)."""
    total = os.lstat(root).st_blocks * 512
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def reset_peak_rss(pid: int) -> bool:
    """Resets VmHWM of a process to its current RSS (Linux >= 4.0, needs ptrace rights)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child is "alive" to kill(0); look at its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@dataclasses.dataclass
class Settled:
    """What a `settle` function of `run_timed` found: an error text, or None once the bucket
    holds what was written; and, when the store told, the `time.monotonic()` of its last
    write, which ends the timed span (waiting to be sure of it is not the tool's time)."""
    error: Optional[str] = None
    last_write: Optional[float] = None


@dataclasses.dataclass
class CmdResult:
    ok: bool
    seconds: Optional[float]
    returncode: Optional[int]
    stdout: str
    stderr: str
    timed_out: bool = False
    client_rss_kb: Optional[int] = None   # largest RSS among the command's processes
    daemon_rss_kb: Optional[int] = None   # peak RSS of the watched daemon during the command
    error: Optional[str] = None
    returned_seconds: Optional[float] = None  # with `settle`: when the command itself exited


def run_timed(cmd: str, *, env: dict, timeout: float, cwd: Optional[str] = None,
              daemon_pid: Optional[int] = None,
              settle: Optional[Callable[[float], Settled]] = None) -> CmdResult:
    """Runs `cmd` with bash in its own process group and times it.

    The wall time spans process start to exit, plus `settle(deadline)` if given (used to wait
    until written objects are visible in the bucket): until the store's last write where the
    settle function knows it, else until it returned.
    `daemon_pid`'s peak RSS is reset before and read after the command.
    """
    if daemon_pid:
        reset_peak_rss(daemon_pid)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        proc = subprocess.Popen(["bash", "-c", cmd], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True)
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.daemon = True
        timer.start()
        try:
            _, status, rusage = os.wait4(proc.pid, 0)
        except BaseException:          # Ctrl-C / SIGTERM: take the command down with us
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            raise
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        error = None
        returned = time.perf_counter() - t0 if settle is not None else None
        t1 = None
        if proc.returncode == 0 and settle is not None and not timed_out.is_set():
            settled = settle(deadline)
            error = settled.error
            if settled.last_write is not None:
                ago = max(0.0, time.monotonic() - settled.last_write)
                t1 = max(t0 + returned, time.perf_counter() - ago)
        if t1 is None:
            t1 = time.perf_counter()
        # Make sure nothing of the group survives (e.g. background jobs after a failure).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    daemon_rss = read_status_kb(daemon_pid, "VmHWM") if daemon_pid else None
    if timed_out.is_set():
        error = f"timed out after {timeout:.0f}s"
    elif proc.returncode != 0:
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        tail = " / ".join(ln.strip()[:160] for ln in lines[-3:])
        error = f"exit {proc.returncode}: {tail}"
    return CmdResult(ok=error is None, seconds=t1 - t0, returncode=proc.returncode, stdout=stdout,
                     stderr=stderr, timed_out=timed_out.is_set(), client_rss_kb=rusage.ru_maxrss,
                     daemon_rss_kb=daemon_rss, error=error, returned_seconds=returned)


def run_quiet(argv: list[str], *, env: Optional[dict] = None, timeout: float = 60,
              check: bool = True) -> subprocess.CompletedProcess:
    """Runs a helper command, capturing output; raises RuntimeError with its stderr on failure."""
    try:
        cp = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{argv[0]} timed out after {timeout}s") from e
    if check and cp.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}... failed ({cp.returncode}): {cp.stderr.strip()[-500:]}")
    return cp


def first_line(argv: list[str]) -> str:
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        text = (cp.stdout or cp.stderr).strip()
        return text.splitlines()[0].strip() if text else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
