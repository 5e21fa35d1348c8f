"""A Redis Cluster of this test run's own: 3 primaries with one replica each.

Six ``redis-server --cluster-enabled yes`` processes on free ports (each port and its
bus port, port + 10000, free), no persistence, in a temporary directory; formed with
``redis-cli --cluster create ... --cluster-replicas 1``; ready once every node reports
``cluster_state:ok`` and every primary has its replica. A short ``cluster-node-timeout``
lets a failover test see a replica promoted within seconds. Only this fixture's own
processes are stopped, by pid.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

NODES = 6
NODE_TIMEOUT_MS = 1000


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` ports whose cluster bus ports (+10000) are free too."""
    found: list[int] = []
    while len(found) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 < 65536 and port not in found and _free(port + 10000):
            found.append(port)
    return found


@dataclass
class Cluster:
    """The running cluster: its ports, its processes, and helpers for the tests."""

    root: Path
    ports: list[int]
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def url(self, query: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports[:3])
        return f"redis+cluster://{hosts}/" + (f"?{query}" if query else "")

    def cli(self, port: int, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
        )
        return done.stdout

    def start(self, port: int) -> None:
        assert port not in self.procs, f"node {port} is running already"
        workdir = self.root / str(port)
        workdir.mkdir(exist_ok=True)
        self.procs[port] = subprocess.Popen(
            [
                "redis-server",
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--save", "",
                "--appendonly", "no",
                "--dir", str(workdir),
                "--logfile", "redis.log",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self, port: int) -> None:
        """Kill one node (SIGKILL, by its pid), as a crash would."""
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(10)

    def answering(self, port: int) -> bool:
        try:
            return self.cli(port, "PING", check=False).strip() == "PONG"
        except subprocess.TimeoutExpired:
            return False

    def primaries(self) -> dict[int, list[int]]:
        """Live primary port -> its live replicas' ports, as the nodes see it."""
        found: dict[int, list[int]] = {}
        ids: dict[str, int] = {}
        rows = []
        for port in self.procs:
            if not self.answering(port):
                continue
            for line in self.cli(port, "CLUSTER", "NODES").splitlines():
                node_id, address, flags, master = line.split()[:4]
                node_port = int(address.split("@")[0].rsplit(":", 1)[1])
                ids[node_id] = node_port
                rows.append((node_port, flags, master))
            break
        for node_port, flags, _ in rows:
            if "master" in flags.split(",") and "fail" not in flags:
                found.setdefault(node_port, [])
        for node_port, flags, master in rows:
            if "slave" in flags.split(",") and "fail" not in flags and master in ids:
                found.setdefault(ids[master], []).append(node_port)
        return found

    def wait_ok(self, timeout: float = 60, replicas: bool = True) -> None:
        """Until every live node reports ``cluster_state:ok`` (and, with ``replicas``,
        every primary serving slots has a replica in sync)."""
        end = time.monotonic() + timeout
        while True:
            states = [self.cli(p, "CLUSTER", "INFO", check=False) for p in self.procs]
            ok = all("cluster_state:ok" in s for s in states)
            if ok and replicas:
                ok = all(
                    "master_link_status:up" in self.cli(p, "INFO", "replication", check=False)
                    for p in self.procs
                    if "role:slave" in self.cli(p, "INFO", "replication", check=False)
                ) and all(len(r) >= 1 for r in self.primaries().values())
            if ok:
                return
            if time.monotonic() > end:
                raise RuntimeError(f"the test Redis Cluster is not ok after {timeout} s: {states}")
            time.sleep(0.2)

    def close(self) -> None:
        for port in list(self.procs):
            with contextlib.suppress(Exception):
                self.stop(port)


def start_cluster(root: Path) -> Cluster:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        raise FileNotFoundError("redis-server and redis-cli are needed for a Redis Cluster")
    cluster = Cluster(root, free_ports(NODES))
    try:
        for port in cluster.ports:
            cluster.start(port)
        end = time.monotonic() + 20
        while not all(cluster.answering(p) for p in cluster.ports):
            if time.monotonic() > end:
                raise RuntimeError("the test Redis Cluster's nodes did not start")
            time.sleep(0.1)
        subprocess.run(
            [
                "redis-cli", "--cluster", "create",
                *(f"127.0.0.1:{p}" for p in cluster.ports),
                "--cluster-replicas", "1", "--cluster-yes",
            ],
            capture_output=True,
            timeout=60,
            check=True,
        )  # fmt: skip
        cluster.wait_ok()
    except BaseException:
        cluster.close()
        raise
    return cluster
