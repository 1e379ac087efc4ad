"""The [executor] table from the command line, and each local search worker's own GPUs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from infrarsi._search._parallel import check_workers
from infrarsi.contract import hardware_mismatch, parse_contract, with_executor_flags
from infrarsi.errors import UsageError

CONTRACT = """\
[task]
name = "toy"
command = ["python", "train.py"]
timeout_s = 60
{task}

[resources]
memory_limit_mb = 500
device = "{device}"

[executor]
kind = "local"
time_limit_min = 30
sbatch = ["--qos=low"]
"""


def _contract(tmp_path, task: str = "", device: str = "cpu"):
    return parse_contract(CONTRACT.format(task=task, device=device), tmp_path / "infrarsi.toml", check_files=False)


def test_flags_replace_the_tables_keys_for_one_command_and_leave_the_pinned_file_alone(tmp_path):
    contract = _contract(tmp_path)
    flags = {"kind": "slurm", "partition": "gpu", "sbatch": ["--constraint=h100"], "gpus_per_node": 2}
    moved = with_executor_flags(contract, flags)
    assert moved.executor.kind == "slurm" and moved.executor.partition == "gpu"
    assert moved.executor.sbatch == ("--constraint=h100",) and moved.executor.gpus_per_node == 2
    assert moved.executor.time_limit_min == 30  # not given: the contract's
    assert moved.executor_flags == flags
    assert (moved.text, moved.sha256) == (contract.text, contract.sha256)
    assert contract.executor.kind == "local" and contract.executor_flags == {}
    assert with_executor_flags(contract, {}) is contract


@pytest.mark.parametrize(
    "flags, says",
    [
        ({"kind": "kubernetes"}, "--executor: expected one of local, slurm"),
        ({"time_limit_min": 0}, "--time-limit-min: expected a value >= 1"),
        ({"gpus_per_node": -1}, "--gpus-per-node: expected a value >= 0"),
        ({"sbatch": ["qos=high"]}, '--sbatch: expected options of the form "--key=value"'),
        ({"nodes": 2}, "unknown [executor] key(s) nodes"),
    ],
)
def test_a_bad_flag_is_a_usage_error_naming_the_flag(tmp_path, flags, says):
    with pytest.raises(UsageError, match=None) as caught:
        with_executor_flags(_contract(tmp_path), flags)
    assert says in str(caught.value)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["kind", "partition", "account", "time_limit_min", "gpus_per_node", "cpus_per_task", "sbatch"]),
        st.one_of(st.text(max_size=12), st.integers(-3, 5), st.lists(st.text(max_size=12), max_size=3), st.none()),
        max_size=4,
    )
)
def test_any_flag_value_is_taken_or_refused_with_a_usage_error(tmp_path_factory, flags):
    contract = _contract(tmp_path_factory.mktemp("c"))
    try:
        moved = with_executor_flags(contract, flags)
    except UsageError as exc:
        assert str(exc).startswith("--") or "[executor]" in str(exc)
    else:
        assert all(moved.executor.values[k] == (tuple(v) if isinstance(v, list) else v) for k, v in flags.items())


def test_only_the_keys_that_decide_the_hardware_must_match_the_baselines(tmp_path):
    contract = _contract(tmp_path)  # kind = "local", sbatch = ["--qos=low"]
    now = with_executor_flags(contract, {"account": "other", "time_limit_min": 5})
    assert hardware_mismatch(now, None) == []
    # A flag that repeats the contract's value is the same hardware.
    assert hardware_mismatch(contract, {"sbatch": ["--qos=low"], "kind": "local"}) == []
    moved = with_executor_flags(contract, {"partition": "b"})
    assert hardware_mismatch(moved, {"partition": "a"}) == ["--partition: 'a' -> 'b'"]
    assert hardware_mismatch(contract, {"kind": "slurm"}) == ["--executor: 'slurm' -> 'local'"]


def test_each_local_worker_gets_gpus_of_its_own_or_several_workers_are_refused(tmp_path):
    gpu = _contract(tmp_path, device="cuda")
    assert check_workers(gpu, 2, ["0", "1", "2"]) == ["0", "1"]
    assert check_workers(gpu, 1, None) is None
    ranks = _contract(tmp_path, task='launcher = "torchrun"\nnproc_per_node = 2', device="cuda")
    assert check_workers(ranks, 2, ["0", "1", "2", "3"]) == ["0,1", "2,3"]  # a GPU per rank
    with pytest.raises(UsageError, match="need 4, got 3"):
        check_workers(ranks, 2, ["0", "1", "2"])
    with pytest.raises(UsageError, match="--devices 0,1"):
        check_workers(gpu, 2, None)
    with pytest.raises(UsageError, match="expected distinct GPU"):
        check_workers(gpu, 2, ["0", "0"])
    # Separate GPUs don't separate two CPU jobs.
    with pytest.raises(UsageError, match="trains on 'cpu'"):
        check_workers(_contract(tmp_path), 2, ["0", "1"])
    # A cluster's jobs get their GPUs from Slurm.
    slurm = with_executor_flags(gpu, {"kind": "slurm"})
    assert check_workers(slurm, 4, None) is None
    with pytest.raises(UsageError, match="from the cluster"):
        check_workers(slurm, 2, ["0", "1"])
