"""Server processes a reliability run starts, faults it injects into them, and stops.

A :class:`ServerProcess` is ``agentrooms serve --dev`` on a free 127.0.0.1 port over one
store URL (``--dev``: no tokens, the agent is named by ``X-Agent``; loopback only). Its
faults act on its own pid only: :meth:`~ServerProcess.kill` is ``kill -9``,
:meth:`~ServerProcess.pause` / :meth:`~ServerProcess.resume` are SIGSTOP / SIGCONT, and
:meth:`~ServerProcess.start` after a kill brings it back on the same port. Every fault is
appended to :attr:`~ServerProcess.faults` as ``(monotonic_ns, what)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2

__all__ = ["ServerProcess", "free_port", "kill_process", "stop_process"]

STORE_UNREACHABLE = 6  # serve's exit code when its store cannot be opened
START_TIMEOUT = 180.0  # a bound on a restart, not a fault: a loaded machine imports slowly


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def kill_process(proc: subprocess.Popen[bytes]) -> None:
    """``kill -9`` of ``proc``'s pid (a process this one started), reaped; nothing if it
    has exited already."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_process(proc: subprocess.Popen[bytes] | None, grace: float = 10.0) -> None:
    """Stop ``proc`` (a process this one started) if it runs: SIGCONT first (in case it
    is stopped), SIGTERM, ``kill -9`` after ``grace`` seconds; reaped."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_process(proc)


class ServerProcess:
    """One ``agentrooms serve --dev`` process on ``url``; ``base`` is its HTTP root."""

    def __init__(self, url: str, workdir: str | Path, port: int | None = None) -> None:
        self.url, self.workdir = url, Path(workdir)
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.faults: list[tuple[int, str]] = []
        self._log = self.workdir / f"server-{self.port}.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def start(self) -> None:
        """Start the process (again, after a kill) and wait until ``/readyz`` answers
        200. A process that exits because its store is out of reach (exit code 6: a
        store fault of the run may be on) is started again, until ``START_TIMEOUT``;
        ``RuntimeError`` (with its output) if it exits otherwise or is not ready in time."""
        assert not self.running, "already running"
        self.proc = self._spawn()
        deadline = time.monotonic() + START_TIMEOUT
        async with httpx2.AsyncClient(timeout=2.0) as http:
            while True:
                try:
                    if (await http.get(f"{self.base}/readyz")).status_code == 200:
                        return
                except httpx2.TransportError:
                    pass
                code = self.proc.poll()
                if time.monotonic() > deadline or code not in (None, STORE_UNREACHABLE):
                    self.stop()
                    raise RuntimeError(f"server on {self.base} did not start: {self.output()}")
                if code == STORE_UNREACHABLE:
                    await asyncio.sleep(0.5)
                    self.proc = self._spawn()
                await asyncio.sleep(0.1)

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "agentrooms", "serve", "--dev"]
        cmd += ["--port", str(self.port), "--url", self.url]
        with open(self._log, "ab") as log:
            return subprocess.Popen(cmd, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        """The tail of everything the process wrote."""
        return self._log.read_text(errors="replace")[-3000:] if self._log.exists() else ""

    def _signal(self, sig: signal.Signals, what: str) -> None:
        assert self.proc is not None and self.running, f"{what}: not running"
        os.kill(self.proc.pid, sig)
        self.faults.append((time.monotonic_ns(), what))

    def kill(self) -> None:
        """``kill -9`` the process and reap it."""
        assert self.proc is not None and self.running, "kill -9: not running"
        kill_process(self.proc)
        self.faults.append((time.monotonic_ns(), "kill -9"))

    def pause(self) -> None:
        """SIGSTOP: the process holds its connections and answers nothing."""
        self._signal(signal.SIGSTOP, "SIGSTOP")

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`: it answers what was queued."""
        self._signal(signal.SIGCONT, "SIGCONT")

    def stop(self) -> None:
        """Stop the process if it runs (:func:`stop_process`)."""
        stop_process(self.proc)
