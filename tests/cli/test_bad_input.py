"""Bad input exits 2 with a message that names the problem, never a traceback, and never touches the ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_testing import ledger_state

from infrarsi import run as run_in_process


def edit_contract(old: str, new: str):
    def prepare(ws: Path) -> None:
        path = ws / "infrarsi.toml"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))

    return prepare


def write(rel: str, data: bytes):
    def prepare(ws: Path) -> None:
        (ws / rel).write_bytes(data)

    return prepare


def tamper_manifest(ws: Path) -> None:
    path = ws / ".infrarsi" / "manifest.json"
    data = json.loads(path.read_text())
    data["manifest"]["files"]["data/protected.txt"] = "0" * 64
    path.write_text(json.dumps(data))


def nothing(ws: Path) -> None:
    pass


CASES = {
    "unknown knob": (nothing, ["run", "--set", "nope=1"], ["nope", "unknown knob", "mode, speed"]),
    "bad choice": (nothing, ["run", "--set", "mode=fast"], ["mode=fast", "expected one of", "crash"]),
    "set without =": (nothing, ["run", "--set", "mode"], ["'mode'", "KNOB=VALUE"]),
    "unknown patch": (nothing, ["run", "--patch", "nothere"], ["nothere", "faster, broken"]),
    "patch twice": (nothing, ["run", "--patch", "faster", "--patch", "faster"], ["twice"]),
    "patch not utf-8": (write("bad.diff", b"\xff\xfe--- a"), ["run", "--patch", "bad.diff"], ["bad.diff", "utf-8"]),
    "runs 0": (nothing, ["baseline", "--runs", "0"], ["--runs 0", "at least 1"]),
    "runs not a number": (nothing, ["baseline", "--runs", "x"], ["--runs", "invalid int value: 'x'"]),
    "missing contract": (nothing, ["run", "--contract", "missing.toml"], ["missing.toml", "no such contract"]),
    "contract not TOML": (edit_contract("[scope]", "[scope"), ["run"], ["infrarsi.toml", "not valid TOML"]),
    "contract unknown key": (
        edit_contract("timeout_s = 20", "timeout_s = 20\ncolour = 'blue'"),
        ["run"],
        ["infrarsi.toml:5", "task.colour", "unknown key"],
    ),
    "contract bad value": (
        edit_contract("timeout_s = 20", "timeout_s = 'soon'"),
        ["baseline", "--runs", "1"],
        ["infrarsi.toml:4", "task.timeout_s", "expected"],
    ),
    "contract bad knob baseline": (
        edit_contract('baseline = "normal"', 'baseline = "warp"'),
        ["run"],
        ["knobs.speed.baseline", "warp"],
    ),
    "contract changed since init": (
        edit_contract("timeout_s = 20", "timeout_s = 21"),
        ["run"],
        ["contract changed", "init --update"],
    ),
    "manifest tampered": (tamper_manifest, ["run"], ["manifest.json", "signature does not verify"]),
    "unknown verb": (nothing, ["bogus"], ["invalid choice: 'bogus'"]),
    "unknown option": (nothing, ["run", "--sett", "mode=ok"], ["unrecognized arguments"]),
}


@pytest.mark.parametrize("prepare, args, fragments", CASES.values(), ids=CASES.keys())
def test_bad_input_exits_2_and_leaves_the_ledger_alone(cli, workspace, prepare, args, fragments):
    run_in_process(workspace / "infrarsi.toml")  # a committed execution that must survive
    before = ledger_state(workspace)
    prepare(workspace)
    done = cli(*args, "--json") if args[0] in ("run", "baseline") else cli(*args)
    assert done.rc == 2, done
    assert "Traceback" not in done.stderr, done
    for fragment in fragments:
        assert fragment in done.stderr, (fragment, str(done))
    if args[0] in ("run", "baseline"):  # --json: still one object on stdout, saying what was wrong
        payload = done.json()
        assert payload["exit_code"] == 2 and fragments[-1] in payload["error"], payload
    assert ledger_state(workspace) == before  # same rows, same bytes on disk


def test_init_with_a_bad_contract_exits_2_and_creates_nothing(cli, toyjob):
    path = toyjob / "infrarsi.toml"
    path.write_text(path.read_text().replace("[resources]", "[resourcez]"))
    done = cli("init")
    assert done.rc == 2, done
    assert "resourcez" in done.stderr and "unknown section" in done.stderr and "Traceback" not in done.stderr
    assert not (toyjob / ".infrarsi").exists()


def test_run_before_init_exits_2_and_says_what_to_do(cli, toyjob):
    done = cli("run", "--json")
    assert done.rc == 2, done
    assert "not initialised" in done.stderr and "infrarsi init" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (toyjob / ".infrarsi" / "ledger.db").exists()


def test_a_file_that_is_not_a_ledger_exits_2(cli, workspace):
    ledger = workspace / ".infrarsi" / "ledger.db"
    ledger.write_bytes(b"this is not sqlite" * 100)
    done = cli("run", "--json")
    assert done.rc == 2, done
    assert "ledger.db" in done.stderr and "Traceback" not in done.stderr
    assert ledger.read_bytes() == b"this is not sqlite" * 100


def test_no_verb_prints_help_and_exits_2(cli):
    done = cli()
    assert done.rc == 2, done
    assert "init" in done.stdout and "baseline" in done.stdout and "run" in done.stdout
