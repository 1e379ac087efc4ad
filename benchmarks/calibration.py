"""Calibrated tolerances on TinyGPT: what `infrarsi baseline --calibrate` picks, and whether the
honest changes still pass and the numerics cheats still fail under them.

A copy of `examples/tinygpt` whose contract says ``loss_rtol = "calibrated"`` and
``grad_norm_rtol = "calibrated"`` is baselined (which calibrates: the original setup under other
thread counts and deterministic kernels, held against its own reference), then every candidate
goes through `infrarsi verify --pairs 0 --keep-going`:

- honest: the bundled speed patches (batched-heads, cached-mask), the honest corpus
  (tests/cheats/honest/), and each knob's other values one at a time (torch.compile left out
  with ``--without compile``: a compiled run compiles for minutes on a CPU);
- cheats: every cheat of the corpus whose expected family is numerics (tests/cheats/expected.toml).

An honest candidate passes when every numerics check passes; a cheat is caught when one fails.

    python benchmarks/calibration.py [--warmup 2 --measure 8] [--only NAME ...] [--without compile] [--json]

Exit 0 when every honest candidate passed and every cheat was caught; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINYGPT = ROOT / "examples" / "tinygpt"
CORPUS = ROOT / "tests" / "cheats"
CLI = [sys.executable, "-m", "infrarsi.cli"]
NUMERICS = ("numerics.loss", "numerics.grad_norm", "numerics.precision")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=1800)


def candidates(contract_text: str, without: set[str]) -> list[dict]:
    """Every candidate: {name, honest, patch (a diff file or a bundled patch name), sets}."""
    out = [
        {"name": "batched-heads + sdpa", "honest": True, "patch": "batched-heads", "sets": ["attention=sdpa"]},
        {"name": "cached-mask", "honest": True, "patch": "cached-mask", "sets": []},
    ]
    for diff in sorted((CORPUS / "honest").glob("*.diff")):
        out.append({"name": f"honest/{diff.stem}", "honest": True, "patch": str(diff), "sets": []})
    knobs = tomllib.loads(contract_text)["knobs"]
    for name, knob in knobs.items():
        if name in without:
            continue
        for value in knob["choices"]:
            if str(value) != str(knob["baseline"]):
                out.append({"name": f"{name}={value}", "honest": True, "patch": None, "sets": [f"{name}={value}"]})
    expected = tomllib.loads((CORPUS / "expected.toml").read_text())["rejected_by"]
    for stem, family in sorted(expected.items()):
        if family == "numerics":
            out.append({"name": f"cheat/{stem}", "honest": False, "patch": str(CORPUS / "cheat" / f"{stem}.diff")})
    return out


def workspace(folder: Path, warmup: int, measure: int) -> Path:
    shutil.copytree(TINYGPT, folder, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    contract = folder / "infrarsi.toml"
    text = contract.read_text()
    for old, new in (
        ("warmup_steps  = 5", f"warmup_steps  = {warmup}"),
        ("measure_steps = 15", f"measure_steps = {measure}"),
        ("loss_rtol      = 1e-3", 'loss_rtol      = "calibrated"'),
        ("grad_norm_rtol = 1e-2", 'grad_norm_rtol = "calibrated"'),
    ):
        assert old in text, old
        text = text.replace(old, new)
    contract.write_text(text)
    return contract


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--measure", type=int, default=8)
    ap.add_argument("--only", nargs="*", help="run only these candidates (by name)")
    ap.add_argument("--without", nargs="*", default=[], help="knobs whose values are not tried (e.g. compile)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        contract = workspace(Path(tmp) / "tinygpt", args.warmup, args.measure)
        for step in (("init",), ("baseline", "--runs", "2", "--json")):
            proc = _cli(*step, "--contract", str(contract))
            if proc.returncode != 0:
                print(proc.stdout + proc.stderr[-3000:], file=sys.stderr)
                return 1
        calibration = json.loads(proc.stdout).get("calibration") or {}
        rows = []
        for cand in candidates(contract.read_text(), set(args.without)):
            if args.only and cand["name"] not in args.only:
                continue
            extra = ["--patch", cand["patch"]] if cand["patch"] else []
            for value in cand.get("sets", []):
                extra += ["--set", value]
            proc = _cli("verify", "--contract", str(contract), *extra, "--pairs", "0", "--keep-going", "--json")
            try:
                checks = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
            except (ValueError, KeyError):
                checks = {}
            failed = [cid for cid in NUMERICS if checks.get(cid, {}).get("status") in ("fail", "unchecked")]
            ran = all(cid in checks and checks[cid]["status"] != "skipped" for cid in NUMERICS)
            window = (checks.get("timing.window") or {}).get("detail", "")
            if not ran and "run is oom" in window:  # the memory cliff: no numerics to judge, not a failure of them
                ran, failed = cand["honest"], failed
            ok = (ran and not failed) if cand["honest"] else bool(failed)
            skipped = "" if ran else window or proc.stderr[-300:]
            rows.append(
                {
                    "name": cand["name"],
                    "honest": cand["honest"],
                    "ok": ok,
                    "failed": failed,
                    "not_run": skipped or None,
                    "loss": (checks.get("numerics.loss") or {}).get("detail", proc.stderr[-300:]),
                }
            )
            if not args.json:
                verdict = (
                    ("passes" if not failed else "FAILS " + ", ".join(failed))
                    if cand["honest"]
                    else ("caught by " + ", ".join(failed) if failed else "NOT CAUGHT")
                )
                if "run is oom" in window:
                    verdict = "out of memory (the contract's memory cliff): no numerics to judge"
                elif skipped:
                    verdict = f"NOT JUDGED: {skipped[:200]}"
                print(f"{'ok ' if ok else 'BAD'} {cand['name']:<40} {verdict}", flush=True)
    report = {
        "calibration": {k: calibration.get(k) for k in ("loss_rtol", "grad_norm_rtol", "observed")},
        "rows": rows,
        "honest_passed": sum(r["ok"] for r in rows if r["honest"]),
        "honest": sum(r["honest"] for r in rows),
        "cheats_caught": sum(r["ok"] for r in rows if not r["honest"]),
        "cheats": sum(not r["honest"] for r in rows),
        "seconds": round(time.monotonic() - started),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"calibrated loss_rtol {report['calibration']['loss_rtol']}, grad_norm_rtol "
            f"{report['calibration']['grad_norm_rtol']} (seen {report['calibration']['observed']}); "
            f"honest {report['honest_passed']}/{report['honest']} passed, cheats "
            f"{report['cheats_caught']}/{report['cheats']} caught, {report['seconds']} s"
        )
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
