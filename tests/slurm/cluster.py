"""A one-node Slurm cluster in a temporary folder: munged, slurmctld and slurmd from Debian's
packages, run as the current user (root in CI) with no cgroups, on ports of their own.

``SLURM_CONF`` in the environment points every client (sinfo, sbatch, scancel, submitit) at it.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["SlurmCluster", "missing_programs"]

PROGRAMS = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "scontrol", "scancel", "squeue")
CTLD_PORT, SLURMD_PORT = 16817, 16818
READY_S = 60


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 * 9 // 10
    return 1024


class SlurmCluster:
    """Start with ``start()``, stop with ``stop()``; ``env`` is what a client needs."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.host = socket.gethostname().split(".")[0]
        self.conf = folder / "slurm.conf"
        self.munge_socket = folder / "munge" / "munge.socket.2"
        self.procs: list[subprocess.Popen] = []
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
                    f"SlurmctldPort={CTLD_PORT}",
                    f"SlurmdPort={SLURMD_PORT}",
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
                    f"SlurmdSpoolDir={f / 'spool'}",
                    f"SlurmctldPidFile={f / 'slurmctld.pid'}",
                    f"SlurmdPidFile={f / 'slurmd.pid'}",
                    f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={f / 'log' / 'slurmd.log'}",
                    f"NodeName={self.host} CPUs={os.cpu_count()} RealMemory={_memory_mb()} State=UNKNOWN",
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )

    def _spawn(self, argv: list[str], log: str) -> None:
        out = open(self.folder / "log" / log, "wb")
        self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env))

    def start(self) -> "SlurmCluster":
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
        self._spawn([_program("slurmd"), "-D", "-f", str(self.conf)], "slurmd.out")
        self._wait(lambda: self._query(["sinfo", "-h", "-o", "%T"]).strip() == "idle", "the node to be idle")
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
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"waiting for {what}: {proc.args[0]} exited {proc.returncode}; {self.logs()}")
            time.sleep(0.2)
        raise RuntimeError(f"waiting for {what}: not within {READY_S} s; {self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted((self.folder / "log").glob("*")) + [self.folder / "munge" / "munged.log"]:
            if path.is_file():
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        subprocess.run(
            ["scancel", "--full", "--user", getpass.getuser()], env=self.env, timeout=10, capture_output=True
        )
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()
