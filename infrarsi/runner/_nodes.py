"""A job across several nodes (``nnodes > 1`` under Slurm): how the nodes find each other, how
one node's failure stops the others, and how their results become one execution.

Each node of the Slurm job runs InfraRSI's own runner (one task per node), which starts
torchrun for that node's ranks with torch's static rendezvous: node 0's torchrun hosts the
store, at the address node 0 publishes in the execution's **rendezvous folder** on the shared
file system (``address.json``: its hostname and a port it found free). A node whose run ends
other than ok drops ``failed-K`` there; every other node's runner, which looks twice a second,
then kills its own ranks (no rank waits on a dead peer until the timeout).

Merging the nodes' parts into one execution: runner/_nodemerge.py.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NodePlace", "join_nodes", "mark_failed", "PEER_FAILED", "RendezvousError"]

PEER_FAILED = "stopped: another node of the job failed first"
_LOOK_S = 0.1


class RendezvousError(RuntimeError):
    """Node 0 never published its address (it failed before, or the file system never showed it)."""


@dataclass(frozen=True)
class NodePlace:
    """This node's place in a job of ``count`` nodes, and where node 0's torchrun listens."""

    rank: int
    count: int
    master_addr: str
    master_port: int
    folder: Path  # the execution's rendezvous folder

    def torchrun_args(self) -> list[str]:
        """What replaces ``--standalone``: torch's static rendezvous at node 0."""
        return [f"--node_rank={self.rank}", f"--master_addr={self.master_addr}", f"--master_port={self.master_port}"]

    def stop_reason(self) -> str | None:
        """PEER_FAILED once another node dropped its ``failed-K`` marker (the launch then kills
        this node's ranks), else None."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return None
        return PEER_FAILED if any(n.startswith("failed-") and n != f"failed-{self.rank}" for n in names) else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def join_nodes(folder: Path, rank: int, count: int, patience_s: float) -> NodePlace:
    """Node ``rank`` of ``count``: node 0 publishes its hostname and a free port in ``folder``;
    the others wait up to ``patience_s`` for it (RendezvousError after)."""
    address = folder / "address.json"
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "address.tmp"
        tmp.write_text(json.dumps({"addr": socket.gethostname(), "port": _free_port()}))
        os.replace(tmp, address)
    deadline = time.monotonic() + patience_s
    while True:
        try:
            published = json.loads(address.read_text())
            return NodePlace(rank, count, str(published["addr"]), int(published["port"]), folder)
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if time.monotonic() >= deadline:
            raise RendezvousError(f"node {rank}: node 0 published no address in {folder} within {patience_s:g} s")
        try:  # NFS: touching the folder's mode makes it look again
            folder.chmod(folder.stat().st_mode)
        except OSError:
            pass
        time.sleep(_LOOK_S)


def mark_failed(folder: Path, rank: int) -> None:
    """Tell the other nodes node ``rank``'s run ended other than ok (or never started)."""
    try:
        (folder / f"failed-{rank}").touch()
    except OSError:
        pass
