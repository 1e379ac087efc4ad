"""A real two-node Slurm cluster (both nodes this machine) for the session (tests/slurm/cluster.py). Under CI=true
these tests must run: a machine without Slurm's packages fails them instead of skipping."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cluster import SlurmCluster, missing_programs  # noqa: E402


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    missing = missing_programs()
    if missing or os.geteuid() != 0:
        why = f"missing {', '.join(missing)}" if missing else "not root (slurmd runs jobs as their user)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Slurm tests ({why}): .ci/run installs slurmctld, slurmd and munge")
        pytest.skip(f"no test Slurm cluster here ({why}); apt-get install slurmctld slurmd munge")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
