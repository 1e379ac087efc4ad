"""A Slurm cluster in a temporary folder: munged, slurmctld and one slurmd per node from
Debian's packages, run as the current user (root in CI) with no cgroups, on free ports of their
own (so two clusters, say two pytest processes, never meet).

Its nodes (``node1``, ``node2``, ...) are all this machine: each is a slurmd of its own
(``slurmd -N NAME``, on a port of its own), so a job across nodes (``srun -N2``) really starts
one task on each slurmd, which a job on a multi-node cluster does.

``SLURM_CONF`` in the environment points every client (sinfo, sbatch, scancel, submitit) at it.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["SlurmCluster", "missing_programs"]

PROGRAMS = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "scontrol", "scancel", "squeue")
READY_S = 60


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    """A port nothing listens on now (another cluster, another session's): the kernel picks it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting for init to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 * 9 // 10
    return 1024


class SlurmCluster:
    """Start with ``start()``, stop with ``stop()``; ``env`` is what a client needs."""

    def __init__(self, folder: Path, nodes: int = 2) -> None:
        self.folder = folder
        self.host = socket.gethostname().split(".")[0]
        self.nodes = [f"node{i}" for i in range(1, nodes + 1)]
        self.conf = folder / "slurm.conf"
        self.munge_socket = folder / "munge" / "munge.socket.2"
        self.pids: list[tuple[str, int]] = []  # (program, pid) of each daemon started
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write(self) -> None:
        for sub in ("munge", "state", "spool", "log"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder / "munge", 0o700)
        key = self.folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        f = self.folder
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=infrarsi-ci",
                    f"SlurmctldHost={self.host}",
                    f"SlurmUser={getpass.getuser()}",
                    f"SlurmctldPort={_free_port()}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "SchedulerType=sched/builtin",
                    "AccountingStorageType=accounting_storage/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "JobCompType=jobcomp/none",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SlurmdTimeout=30",
                    "InactiveLimit=0",
                    "KillWait=5",
                    "MinJobAge=600",
                    f"StateSaveLocation={f / 'state'}",
                    f"SlurmdSpoolDir={f / 'spool'}/%n",
                    f"SlurmctldPidFile={f / 'slurmctld.pid'}",
                    f"SlurmdPidFile={f / 'slurmd.%n.pid'}",
                    f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={f / 'log' / 'slurmd.%n.log'}",
                    *(
                        f"NodeName={name} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={_free_port()} "
                        f"CPUs={os.cpu_count()} RealMemory={_memory_mb()} State=UNKNOWN"
                        for name in self.nodes
                    ),
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def _spawn(self, argv: list[str], log: str) -> None:
        """Start a daemon that is no descendant of this process: a shell starts it in a session of
        its own and exits, so it belongs to init. The pytest process may be a child subreaper
        while a test runs a workload (the runner adopts and kills the orphans of its run);
        slurmd's job steps must never be orphans it could adopt."""
        done = subprocess.run(
            ["sh", "-c", 'log="$1"; shift; setsid "$@" </dev/null >"$log" 2>&1 & echo $!', "sh"]
            + [str(self.folder / "log" / log)]
            + argv,
            capture_output=True,
            text=True,
            env=self.env,
            check=True,
        )
        self.pids.append((argv[0], int(done.stdout.split()[0])))

    def start(self) -> "SlurmCluster":
        """Write the configuration, start the three daemons, wait for the node to be idle; on any
        failure, stop whatever started (no daemon outlives a failed start)."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> "SlurmCluster":
        self._write()
        m = self.folder / "munge"
        self._spawn(
            [
                _program("munged"),
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={m / 'munge.key'}",
                f"--pid-file={m / 'munged.pid'}",
                f"--log-file={m / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}",
            ],
            "munged.out",
        )
        self._wait(lambda: self.munge_socket.exists(), "munged to open its socket")
        self._spawn([_program("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        self._wait(lambda: self._query(["scontrol", "ping"]).find("UP") >= 0, "slurmctld to answer")
        for name in self.nodes:
            (self.folder / "spool" / name).mkdir(parents=True, exist_ok=True)
            self._spawn([_program("slurmd"), "-D", "-N", name, "-f", str(self.conf)], f"slurmd.{name}.out")
        idle = f"idle {len(self.nodes)}"
        self._wait(lambda: self._query(["sinfo", "-h", "-o", "%T %D"]).strip() == idle, "every node to be idle")
        return self

    def _query(self, argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=10)
        except subprocess.TimeoutExpired:
            return ""
        return done.stdout

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if ready():
                return
            for program, pid in self.pids:
                if not _alive(pid):
                    raise RuntimeError(f"waiting for {what}: {program} exited; {self.logs()}")
            time.sleep(0.2)
        raise RuntimeError(f"waiting for {what}: not within {READY_S} s; {self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted((self.folder / "log").glob("*")) + [self.folder / "munge" / "munged.log"]:
            if path.is_file():
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        if any(_alive(pid) for program, pid in self.pids if program.endswith("slurmctld")):
            try:
                subprocess.run(
                    ["scancel", "--full", "--user", getpass.getuser()], env=self.env, timeout=10, capture_output=True
                )
            except subprocess.TimeoutExpired:
                pass
        for _, pid in reversed(self.pids):
            for sig, patience in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
                if _alive(pid):
                    os.kill(pid, sig)
                deadline = time.monotonic() + patience
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
        self.pids.clear()
