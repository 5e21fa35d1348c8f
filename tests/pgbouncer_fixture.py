"""pgbouncer in front of the test PostgreSQL, as an operator runs it: Debian's package,
started per test run on a free port with its own ini and userlist in a temporary
directory, stopped (its own pid only) at the run's end.

:func:`start` takes the pool mode, a ``connect_query`` (run on every server connection
it opens) and any further ``[pgbouncer]`` settings (such as ``ignore_startup_parameters``),
to reproduce a pooler that changes or drops session settings. Authentication is
``trust``, like the test server's.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

_START_TIMEOUT = 10.0  # seconds pgbouncer gets to answer on its port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5):
            return True
    except OSError:
        return False


@dataclass
class PgBouncer:
    """One running pgbouncer: ``url(dbname)`` reaches ``dbname`` through it."""

    port: int
    process: subprocess.Popen[bytes]
    directory: Path
    user: str

    def url(self, dbname: str, query: str = "") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}" + (
            f"?{query}" if query else ""
        )

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def available() -> bool:
    return shutil.which("pgbouncer") is not None


def start(
    postgres_url: str, pool_mode: str, connect_query: str | None = None, **settings: str
) -> PgBouncer:
    """Start pgbouncer in ``pool_mode`` in front of ``postgres_url``'s server (every
    database), with ``settings`` added to its ``[pgbouncer]`` section."""
    server = urlsplit(postgres_url)
    user = server.username or "postgres"
    directory = Path(tempfile.mkdtemp(prefix="agentrooms-pgbouncer-"))
    port = _free_port()
    ini = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(port),
        "unix_socket_dir": "",
        "auth_type": "trust",
        "auth_file": str(directory / "userlist.txt"),
        "pool_mode": pool_mode,
        "max_client_conn": "500",
        "default_pool_size": "20",
        "logfile": str(directory / "pgbouncer.log"),
        "pidfile": "",
        "log_connections": "0",
        "log_disconnections": "0",
        **settings,
    }
    if os.geteuid() == 0:  # pgbouncer will not run as root: it switches to this user
        ini["user"] = _unprivileged_user()
    lines = [
        "[databases]",
        f"* = host={server.hostname or '127.0.0.1'} port={server.port or 5432}"
        + (
            ""
            if connect_query is None
            else " connect_query='{}'".format(connect_query.replace("'", "''"))
        ),
        "[pgbouncer]",
        *(f"{k} = {v}" for k, v in ini.items()),
    ]
    (directory / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
    (directory / "userlist.txt").write_text(f'"{user}" ""\n')
    if "user" in ini:
        uid = pwd.getpwnam(ini["user"]).pw_uid
        for path in (directory, *directory.iterdir()):
            os.chown(path, uid, -1)
    with (directory / "stderr.log").open("wb") as stderr:
        process = subprocess.Popen(
            ["pgbouncer", str(directory / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    bouncer = PgBouncer(port, process, directory, user)
    deadline = time.monotonic() + _START_TIMEOUT
    while not _answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            log = (directory / "stderr.log").read_text(errors="replace") + bouncer.log()
            bouncer.stop()
            raise RuntimeError(f"pgbouncer did not start: {log}")
        time.sleep(0.05)
    return bouncer


def _unprivileged_user() -> str:
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("no unprivileged user for pgbouncer to run as")
