"""`infrarsi audit` at scale: a realistic synthetic ledger of N executions, re-audited.

Builds the ledger through the project's own ledger API (`infrarsi.ledger.Ledger`,
`KeyPair`), from a real template: the bundled TinyGPT workload with a 30-step window
(10 warm-up + 20 measured) is initialised, baselined twice and verified once
(`attention=sdpa` + `batched-heads`, no A/B pairs), and its rows and blobs (receipts,
runner evidence, patch, pre-image, contract, baseline summary) are the templates. A new
ledger with a new key then gets N execution rows, each written the way
`Workspace.record` writes one:

- verify batches (a verify row and 5 interleaved A/B pairs), verify-only rows, verify rows
  that crashed / ran out of memory / timed out, verify rows rejected before running (a
  protected file differed from the manifest: a check the audit does not re-judge), `run`
  rows, and a re-baseline (2 baseline rows + a baseline summary) about every 1,000 rows;
- about one distinct patch per ten executions: each a real unified diff of model.py
  against the template's pre-image (the batched-heads change plus a `# variant K`
  line), made with difflib and checked with `git apply --check`;
- honest rows vary: every clock stamp of a run (probe t0/t1, the runner's arrivals,
  start and end) is mapped by one affine map, 0.9-1.1x around a start on a fake monotonic
  clock, so nearly every receipts and evidence blob is distinct; losses and gradient
  norms stay the template's, within the contract's tolerances. oom / crash / timeout rows
  carry no receipts (only a small evidence blob);
- planted bad rows, about 0.1% and at least 5 of each kind: (a) a loss 5% off the
  baseline at one step (numerics.loss), (b) one measured step's arrival stamp 200 ms
  before the probe says the step ended (timing.clock), (c) a patch reassigning
  `time.monotonic_ns` in train.py (tests/cheats/cheat/slow-clock.diff; audit.clock_patched),
  (d) a receipts_hash naming a blob that was never stored (unchecked).

Then it times `infrarsi audit LEDGER --key HEX --json` in a subprocess (wall time; the
child's peak RSS from the rusage that `os.wait4` returns for it, i.e. what
`getrusage(RUSAGE_CHILDREN).ru_maxrss` reports for a parent whose only child is the
audit; the template build's training runs would otherwise dominate that figure) and a
raw full scan of the same rows, the floor: one pass that SELECTs every execution row,
reads its receipts and evidence blobs and parses them (json.loads of every receipt line
and of the evidence), nothing else.

    python benchmarks/audit_scale.py --executions N [--json] [--keep DIR] [--template DIR] [--seed S]

With --json it prints one JSON line: executions, audit_s, scan_s, peak_rss_mb, findings,
planted, planted_found, build_s, ratio (audit_s / scan_s). Exit status 1 when a planted
row is not among the findings, an honest row has a finding, or the chain does not
verify (details on stderr). Goal at 100,000 executions: ratio <= 10, RSS < 1 GiB.

--keep DIR keeps the built ledger at DIR/ws/.infrarsi/ledger.db (with DIR/bench.json:
the public key and the planted ids); --template DIR builds the template workspace there,
or reuses the one already there (saves the 30-60 s of training runs).
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path

from infrarsi.ledger import KeyPair, Ledger, canonical_json, sha256_hex

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "tinygpt"
SLOW_CLOCK = REPO / "tests" / "cheats" / "cheat" / "slow-clock.diff"

WARMUP, MEASURE = 10, 20
STEPS = WARMUP + MEASURE
PAIRS = 5
REBASELINE_EVERY = 1000
PLANT_KINDS = ("loss", "clock", "clock_patch", "missing_receipts")
RUN_IDS = (
    "integrity.protected",
    "integrity.framework",
    "integrity.containment",
    "timing.window",
    "timing.clock",
    "numerics.loss",
    "numerics.grad_norm",
    "numerics.precision",
)
SCOPE_IDS = ("scope.parse", "scope.binary", "scope.editable", "scope.created", "scope.protected")


# -- the template ----------------------------------------------------------------------------


# What an older InfraRSI wrote in rule_version: its verdicts are re-judged from source.
OLD_RULE_VERSION = "verifiers-1+auditors-0"
from infrarsi._policy import VERDICT_VERSION  # noqa: E402 - what today's code writes


def build_template(ws: Path, log) -> Path:
    """The TinyGPT workspace with a 30-step window, initialised, baselined (2 runs), verified once."""
    ledger = ws / ".infrarsi" / "ledger.db"
    if ledger.exists():
        with Ledger.open(ledger) as led:
            if any(r["kind"] == "verify" and r["status"] == "ok" for r in led.executions()):
                log(f"template: reusing {ws}")
                return ws
        raise SystemExit(f"{ws}: holds a ledger without an ok verify row; remove it to rebuild the template")
    import infrarsi

    if ws.exists():
        shutil.rmtree(ws)
    shutil.copytree(EXAMPLE, ws, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    toml = ws / "infrarsi.toml"
    text = toml.read_text()
    text = re.sub(r"(?m)^warmup_steps\s*=.*$", f"warmup_steps  = {WARMUP}", text)
    text = re.sub(r"(?m)^measure_steps\s*=.*$", f"measure_steps = {MEASURE}", text)
    toml.write_text(text)
    started = time.perf_counter()
    log(f"template: building in {ws} (2 baseline runs and 1 verify run of TinyGPT, 30-60 s)")
    infrarsi.init(toml)
    infrarsi.baseline(toml, runs=2)
    outcome = infrarsi.verify(toml, sets={"attention": "sdpa"}, patches=["batched-heads"], pairs=0)
    bad = [c for c in outcome.checks if c.status in ("fail", "unchecked")]
    if bad:
        raise SystemExit(f"template verify failed: {[(c.id, c.detail) for c in bad]}")
    log(f"template: built in {time.perf_counter() - started:.1f} s")
    return ws


@dataclass
class RunTemplate:
    """One real run: parsed receipt lines, the runner's evidence, its row's figures."""

    lines: list[dict]
    evidence: dict
    step_time_s: float
    peak_mem_mb: float | None
    wall_s: float


@dataclass
class Template:
    contract_text: bytes
    contract_hash: str
    manifest_hash: str
    summary: dict
    knobs: dict  # name -> (choices, baseline)
    baselines: list[RunTemplate]
    candidate: RunTemplate
    pre_verdicts: list[dict]  # scope.*, integrity.manifest, audit.*: before the run
    run_verdicts: list[dict]  # the run's checks
    rule_version: str
    patch_name: str
    patch_text: str
    model_pre: bytes
    train_pre: bytes
    min_speedup: float
    cand_factor: float = 1.0  # the candidate's clock scale, so that it is clearly faster


def load_template(ws: Path) -> Template:
    with Ledger.open(ws / ".infrarsi" / "ledger.db") as led:
        rows = list(led.executions())
        summary = led.latest_baseline()["summary"]

        def run(row) -> RunTemplate:
            receipts = led.get_blob(row["receipts_hash"]).decode()
            return RunTemplate(
                [json.loads(line) for line in receipts.splitlines()],
                json.loads(led.get_blob(row["evidence_hash"])),
                row["step_time_s"],
                row["peak_mem_mb"],
                row["wall_s"],
            )

        base_rows = [r for r in rows if r["kind"] == "baseline" and r["status"] == "ok"]
        verify = next(r for r in rows if r["kind"] == "verify" and r["status"] == "ok")
        contract_text = led.get_blob(verify["contract_hash"])
        (patch,) = verify["patches"]
        ((model_path, model_hash),) = verify["sources"].items()
        assert model_path == "model.py", verify["sources"]
        contract_toml = tomllib.loads(contract_text.decode())
        tpl = Template(
            contract_text=contract_text,
            min_speedup=float(contract_toml["search"]["min_speedup"]),
            contract_hash=verify["contract_hash"],
            manifest_hash=verify["manifest_hash"],
            summary=summary,
            knobs={name: (list(k["choices"]), k["baseline"]) for name, k in contract_toml["knobs"].items()},
            baselines=[run(r) for r in base_rows],
            candidate=run(verify),
            pre_verdicts=[v for v in verify["verdicts"] if v["id"] not in RUN_IDS],
            run_verdicts=[v for v in verify["verdicts"] if v["id"] in RUN_IDS],
            # Rows the builder writes stand for rows today's code wrote (the template may be older).
            rule_version=VERDICT_VERSION,
            patch_name=patch["name"],
            patch_text=led.get_blob(patch["sha256"]).decode(),
            model_pre=led.get_blob(model_hash),
            train_pre=(ws / "train.py").read_bytes(),
        )
    assert sha256_hex(tpl.contract_text) == tpl.contract_hash
    base_median = sorted(b.step_time_s for b in tpl.baselines)[0]
    # The audit re-judges each verify batch's speedup: keep the candidate clearly faster.
    tpl.cand_factor = min(1.0, 0.75 * base_median / tpl.candidate.step_time_s)
    return tpl


def post_image(pre: bytes, patch_text: str) -> str:
    """model.py after the template patch, by `git apply` in a scratch folder."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "model.py").write_bytes(pre)
        (Path(tmp) / "p.diff").write_text(patch_text)
        subprocess.run(["git", "apply", "p.diff"], cwd=tmp, check=True, capture_output=True)
        return (Path(tmp) / "model.py").read_text()


def git_apply_check(files: dict[str, bytes], patch_text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        (Path(tmp) / "p.diff").write_text(patch_text)
        proc = subprocess.run(["git", "apply", "--check", "p.diff"], cwd=tmp, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"git apply --check rejects a generated patch: {proc.stderr.strip()}\n{patch_text}")


class Variants:
    """Distinct patches of model.py: the template change plus a `# variant K` line."""

    def __init__(self, tpl: Template) -> None:
        self.pre = tpl.model_pre.decode()
        post = post_image(tpl.model_pre, tpl.patch_text)
        marker = "        b, t, d = x.shape\n"
        if marker not in post:
            raise SystemExit("the template's patched model.py has no `b, t, d = x.shape` line to mark")
        self.head, self.tail = post.split(marker, 1)
        self.marker = marker
        self.count = 0

    def make(self) -> str:
        k = self.count
        self.count += 1
        post = f"{self.head}        # variant {k}\n{self.marker}{self.tail}"
        diff = difflib.unified_diff(
            self.pre.splitlines(keepends=True), post.splitlines(keepends=True), "a/model.py", "b/model.py"
        )
        return "diff --git a/model.py b/model.py\n" + "".join(diff)


# -- synthetic runs --------------------------------------------------------------------------


class Clock:
    """A fake CLOCK_MONOTONIC that moves forward run by run."""

    def __init__(self, start_ns: int, rng: random.Random) -> None:
        self.now, self.rng = start_ns, rng

    def start(self) -> int:
        self.now += self.rng.randint(200_000_000, 3_000_000_000)
        return self.now


def render(
    run: RunTemplate, start_ns: int, scale: float, rng: random.Random, plant: str | None = None
) -> tuple[bytes, dict, dict]:
    """Receipts and evidence of one run: every clock stamp mapped by x -> start + (x - t0) * scale."""
    origin = run.evidence["started_ns"]

    def at(x: int) -> int:
        return start_ns + round((x - origin) * scale)

    pid = rng.randint(1000, 4_000_000)
    lines = []
    for rec in run.lines:
        rec = dict(rec)
        for key in ("t_ns", "t0_ns", "t1_ns"):
            if type(rec.get(key)) is int:
                rec[key] = at(rec[key])
        if "pid" in rec:
            rec["pid"] = pid
        lines.append(rec)
    ev = dict(run.evidence)
    ev["started_ns"], ev["ended_ns"] = start_ns, at(run.evidence["ended_ns"])
    ev["arrivals_ns"] = [at(a) for a in run.evidence["arrivals_ns"]]
    guard = dict(ev.get("guard") or {})
    if "samples" in guard:
        guard["samples"] = max(1, round(guard["samples"] * scale))
    if isinstance(guard.get("peak_rss_bytes"), int):
        guard["peak_rss_bytes"] += rng.randint(-4, 4) * 2**20
    ev["guard"] = guard
    detail = {}
    if plant == "loss":
        index, step = _step_line(lines, rng.randint(1, STEPS))
        lines[index]["loss"] = lines[index]["loss"] * 1.05
        detail = {"step": step}
    elif plant == "clock":
        index, step = _step_line(lines, rng.randint(WARMUP + 1, STEPS - 1))
        ev["arrivals_ns"][index] -= 200_000_000
        detail = {"step": step}
    receipts = ("\n".join(json.dumps(r, separators=(",", ":")) for r in lines) + "\n").encode()
    return receipts, ev, detail


def _step_line(lines: list[dict], step: int) -> tuple[int, int]:
    for index, rec in enumerate(lines):
        if rec.get("type") == "step" and rec.get("step") == step:
            return index, step
    raise SystemExit(f"the template receipts have no step {step}")


def self_check(tpl: Template, ws: Path) -> None:
    """The template's evidence passes at the clock scales used, and each planted change is caught."""
    from infrarsi import load_contract
    from infrarsi.verifiers import BaselineReference, Rules, RunEvidence, judge_run

    contract = load_contract(ws / "infrarsi.toml")
    rules, ref = Rules.from_contract(contract), BaselineReference.from_summary(tpl.summary)
    rng = random.Random(1)

    def judged(run, scale, plant=None):
        receipts, ev, _ = render(run, 10**15, scale, rng, plant)
        evidence = RunEvidence(
            receipt_lines=receipts.decode().splitlines(),
            arrivals_ns=ev["arrivals_ns"],
            started_ns=ev["started_ns"],
            ended_ns=ev["ended_ns"],
            integrity=ev["integrity"],
            evidence_kind=ev.get("evidence_kind", "probe"),
        )
        return {c.id: c for c in judge_run(evidence, ref, rules)}

    runs = [(b, 1.0) for b in tpl.baselines] + [(tpl.candidate, tpl.cand_factor)]
    for run, factor in runs:
        for scale in (0.9 * factor, 1.1 * factor):  # the checks are monotone in the scale
            bad = [(c.id, c.detail) for c in judged(run, scale).values() if c.status != "pass"]
            if bad:
                raise SystemExit(f"template evidence fails at clock scale {scale:.3f}: {bad}")
    for plant, cid in (("loss", "numerics.loss"), ("clock", "timing.clock")):
        for _ in range(20):
            if judged(tpl.candidate, tpl.cand_factor, plant)[cid].status != "fail":
                raise SystemExit(f"planted {plant!r} change does not fail {cid}")


# -- the ledger ------------------------------------------------------------------------------


@dataclass
class Built:
    path: Path
    public_key: str
    executions: int
    planted: dict[str, list[int]]
    patches: int
    by_status: dict[str, int]
    build_s: float


class Builder:
    def __init__(
        self, tpl: Template, ledger: Ledger, n: int, rng: random.Random, progress, old_fraction: float = 0.1
    ) -> None:
        self.tpl, self.ledger, self.n, self.rng, self.progress = tpl, ledger, n, rng, progress
        self.old_fraction = old_fraction
        self.variants = Variants(tpl)
        self.clock = Clock(tpl.baselines[0].evidence["started_ns"], rng)
        self.baseline_id: int | None = None
        self.since_baseline = 0
        self.written = 0
        self.by_status: dict[str, int] = {}
        self.planted: dict[str, list[int]] = {kind: [] for kind in PLANT_KINDS}
        per_kind = max(5, math.ceil(n * 0.001 / len(PLANT_KINDS)))
        if per_kind * len(PLANT_KINDS) * 4 > n:
            raise SystemExit(f"--executions {n}: too few rows for {per_kind} planted rows of each kind")
        hi = max(10, int(n * 0.97))
        self.pending = sorted((rng.randint(3, hi), kind) for kind in PLANT_KINDS for _ in range(per_kind))
        self.current_patch: tuple[str, str] | None = None
        self.next_tick = 1
        self.slow_clock = SLOW_CLOCK.read_text()
        git_apply_check({"train.py": tpl.train_pre}, self.slow_clock)
        git_apply_check({"model.py": tpl.model_pre}, Variants(tpl).make())

    # -- rows ------------------------------------------------------------------------------

    def _knobs(self, baseline: bool = False) -> dict:
        if baseline:
            return {name: base for name, (_, base) in self.tpl.knobs.items()}
        return {name: self.rng.choice(choices) for name, (choices, _) in self.tpl.knobs.items()}

    def _append(
        self,
        kind: str,
        batch: str,
        seq: int,
        status: str,
        *,
        knobs: dict,
        patches=(),
        run: RunTemplate | None = None,
        factor: float = 1.0,
        verdicts=None,
        detail: str = "",
        exit_code: int | None = 0,
        baseline_id: int | None = None,
        plant: str | None = None,
        step_scale: float | None = None,
        rule_version: str | None = None,
    ) -> tuple[int, float | None]:
        blobs: dict[str, tuple[bytes, str]] = {}
        patch_refs, sources = [], {}
        for name, text, path, pre in patches:
            blobs[f"patch:{name}"] = (text.encode(), "patch")
            patch_refs.append({"name": name, "sha256": sha256_hex(text.encode())})
            blobs[f"source:{path}"] = (pre, "source")
            sources[path] = sha256_hex(pre)
        receipts_hash = evidence_hash = None
        step_time = peak = None
        start = self.clock.start()
        wall = 0.0
        stderr = ""
        if status == "ok" and run is not None:
            if (
                plant is None
                and self.pending
                and self.pending[0][0] <= self.written + 1
                and self.pending[0][1] in ("loss", "clock", "missing_receipts")
                and kind != "baseline"
            ):
                plant = self.pending.pop(0)[1]
            scale = (step_scale or self.rng.uniform(0.9, 1.1)) * factor
            receipts, evidence, _ = render(run, start, scale, self.rng, plant)
            self.clock.now = evidence["ended_ns"]
            data = canonical_json(evidence)
            receipts_hash, evidence_hash = sha256_hex(receipts), sha256_hex(data)
            if plant != "missing_receipts":  # (d): the hash of receipts that were never stored
                blobs["receipts"] = (receipts, "receipts")
            blobs["evidence"] = (data, "evidence")
            step_time, wall = run.step_time_s * scale, run.wall_s * scale
            peak = run.peak_mem_mb
        elif status in ("oom", "crash", "timeout"):
            wall = {"oom": self.rng.uniform(2, 8), "crash": self.rng.uniform(1, 4), "timeout": 300.0}[status]
            end = start + int(wall * 1e9)
            self.clock.now = end
            limit = 560
            if status == "oom":
                rss = self.rng.randint(limit + 1, limit + 40)
                detail = (
                    f"needs more than the limit of {limit} MB (killed when the process tree's RSS reached {rss} MB)"
                )
                exit_code = -9
            elif status == "timeout":
                detail, exit_code = "killed after the timeout of 300 s", -9
            else:
                err = f"RuntimeError: shape mismatch in variant at line {self.rng.randint(40, 160)}"
                stderr = f'Traceback (most recent call last):\n  File "train.py", line 88, in <module>\n{err}\n'
                detail, exit_code = f"exit code 1: {err}", 1
                peak = round(self.rng.uniform(200, 480), 1)
            evidence = {
                "version": 1,
                "argv": ["python", "train.py"],
                "evidence_kind": "probe",
                "started_ns": start,
                "ended_ns": end,
                "arrivals_ns": [],
                "stdout_lines": 0,
                "bad_receipt_lines": 0,
                "receipts_ended": False,
                "guard": {
                    "interval_s": 0.01,
                    "samples": int(wall * 100),
                    "limit_bytes": limit * 2**20,
                    "censored": status == "oom",
                },
                "fingerprint": self.tpl.candidate.evidence.get("fingerprint", {}),
            }
            data = canonical_json(evidence)
            evidence_hash = sha256_hex(data)
            blobs["evidence"] = (data, "evidence")
        row = self.ledger.append_execution(
            {
                "batch": batch,
                "kind": kind,
                "seq": seq,
                "contract_hash": self.tpl.contract_hash,
                "manifest_hash": self.tpl.manifest_hash,
                "knobs": knobs,
                "patches": patch_refs,
                "sources": sources,
                "status": status,
                "detail": detail,
                "exit_code": exit_code,
                "step_time_s": step_time,
                "peak_mem_mb": peak,
                "device_s": wall,
                "wall_s": wall,
                "receipts_hash": receipts_hash,
                "evidence_hash": evidence_hash,
                "stderr_tail": stderr,
                "verdicts": verdicts,
                "rule_version": (rule_version or self.tpl.rule_version) if verdicts is not None else None,
                "baseline_id": baseline_id,
            },
            blobs=blobs,
        )
        if plant:
            self.planted[plant].append(row)
        self.written += 1
        self.since_baseline += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        if self.progress and self.written >= self.next_tick * self.n / 10:
            self.next_tick += 1
            self.progress(self.written, self.n)
        return row, step_time

    def _variant(self) -> tuple[str, str, str, bytes]:
        k = self.variants.count
        text = self.variants.make()
        self.current_patch = (f"{self.tpl.patch_name}-v{k}", text)
        return (f"{self.tpl.patch_name}-v{k}", text, "model.py", self.tpl.model_pre)

    def _pre_verdicts(self) -> list[dict]:
        return [dict(v) for v in self.tpl.pre_verdicts]

    # -- episodes --------------------------------------------------------------------------

    def rebaseline(self) -> None:
        batch = uuid.uuid4().hex
        ids, times = [], []
        for seq, run in enumerate(self.tpl.baselines[:2]):
            row, step = self._append("baseline", batch, seq, "ok", knobs=self._knobs(True), run=run)
            ids.append(row)
            times.append(step)
        summary = json.loads(json.dumps(self.tpl.summary))
        center = sorted(times)[len(times) // 2] if len(times) % 2 else sum(times) / len(times)
        summary["executions"], summary["run_step_times_s"] = ids, times
        summary["step_time_s"] = dict(summary["step_time_s"], median=center)
        self.baseline_id = self.ledger.append_baseline(batch, summary)
        self.since_baseline = 0

    def verify_batch(self, pairs: int) -> None:
        """verify + `pairs` A/B pairs (B A A B ...), as `infrarsi verify` records them."""
        from infrarsi.verifiers import ab_order, check_speedup

        batch, patch, knobs = uuid.uuid4().hex, self._variant(), self._knobs()
        # A ledger spans rule versions: some batches were judged by older rules and are re-judged.
        version = OLD_RULE_VERSION if self.rng.random() < self.old_fraction else None
        scales = None
        for _ in range(50):  # honest batches show their (real) speedup; resample the rare miss
            scales = {
                "B": [self.rng.uniform(0.9, 1.1) for _ in range(pairs)],
                "A": [self.rng.uniform(0.9, 1.1) for _ in range(pairs)],
            }
            bases = [self.tpl.baselines[i % len(self.tpl.baselines)] for i in range(pairs)]
            base_t = [b.step_time_s * s for b, s in zip(bases, scales["B"])]
            cand_t = [self.tpl.candidate.step_time_s * self.tpl.cand_factor * s for s in scales["A"]]
            if pairs == 0 or check_speedup(base_t, cand_t, self.tpl.min_speedup, pairs)[0].passed:
                break
        self._append(
            "verify",
            batch,
            0,
            "ok",
            knobs=knobs,
            patches=[patch],
            run=self.tpl.candidate,
            factor=self.tpl.cand_factor,
            verdicts=self._pre_verdicts() + self.tpl.run_verdicts,
            baseline_id=self.baseline_id,
            rule_version=version,
        )
        index = {"B": 0, "A": 0}
        for seq, role in enumerate(ab_order(pairs), start=1):
            i = index[role]
            index[role] += 1
            if role == "B":
                self._append(
                    "ab-baseline",
                    batch,
                    seq,
                    "ok",
                    knobs=self._knobs(True),
                    run=self.tpl.baselines[i % len(self.tpl.baselines)],
                    step_scale=scales["B"][i],
                    verdicts=self.tpl.run_verdicts,
                    baseline_id=self.baseline_id,
                    rule_version=version,
                )
            else:
                self._append(
                    "ab-candidate",
                    batch,
                    seq,
                    "ok",
                    knobs=knobs,
                    patches=[patch],
                    run=self.tpl.candidate,
                    factor=self.tpl.cand_factor,
                    step_scale=scales["A"][i],
                    verdicts=self.tpl.run_verdicts,
                    baseline_id=self.baseline_id,
                    rule_version=version,
                )

    def verify_failed(self, status: str) -> None:
        """A verify whose candidate run ended oom / crash / timeout: nothing after it."""
        row_detail = {"oom": "out of memory", "crash": "crashed", "timeout": "timed out"}[status]
        verdicts = self._pre_verdicts() + [
            {"id": "timing.window", "status": "fail", "detail": f"the candidate run is {status}: {row_detail}"}
        ]
        self._append(
            "verify",
            uuid.uuid4().hex,
            0,
            status,
            knobs=self._knobs(),
            patches=[self._variant()],
            verdicts=verdicts,
            baseline_id=self.baseline_id,
        )

    def verify_rejected(self) -> None:
        """Rejected before running: a protected file differed from the manifest (not re-judged by audit)."""
        detail = "protected files differ from the manifest: data/corpus.txt"
        verdicts = [v for v in self._pre_verdicts() if v["id"] in SCOPE_IDS]
        verdicts.append({"id": "integrity.manifest", "status": "fail", "detail": detail})
        self._append(
            "verify",
            uuid.uuid4().hex,
            0,
            "rejected",
            knobs=self._knobs(),
            patches=[self._variant()],
            verdicts=verdicts,
            detail=f"rejected before running: {detail}",
            exit_code=None,
            baseline_id=self.baseline_id,
        )

    def run_row(self, status: str) -> None:
        """`infrarsi run`: knobs, perhaps the latest patch; no verdicts, no baseline_id (as run records it)."""
        patches = []
        if self.current_patch and self.rng.random() < 0.6:
            name, text = self.current_patch
            patches = [(name, text, "model.py", self.tpl.model_pre)]
        run, factor = (
            (self.tpl.candidate, self.tpl.cand_factor) if patches else (self.rng.choice(self.tpl.baselines), 1.0)
        )
        self._append("run", uuid.uuid4().hex, 0, status, knobs=self._knobs(), patches=patches, run=run, factor=factor)

    def clock_patch(self) -> None:
        """Planted (c): a verify row whose patch reassigns time.monotonic_ns in train.py, stored as passing
        by an older rule version (a past win that today's rules must re-judge)."""
        patch = ("slow-clock", self.slow_clock, "train.py", self.tpl.train_pre)
        self._append(
            "verify",
            uuid.uuid4().hex,
            0,
            "ok",
            knobs=self._knobs(),
            patches=[patch],
            run=self.tpl.candidate,
            factor=self.tpl.cand_factor,
            verdicts=self._pre_verdicts() + self.tpl.run_verdicts,
            baseline_id=self.baseline_id,
            plant="clock_patch",
            rule_version=OLD_RULE_VERSION,
        )

    def build(self) -> None:
        rng = self.rng
        while self.written < self.n:
            left = self.n - self.written
            due = self.pending and self.pending[0][0] <= self.written + 1
            if self.baseline_id is None or (self.since_baseline >= REBASELINE_EVERY and left > 2 + len(self.pending)):
                self.rebaseline()
            elif due and self.pending[0][1] == "clock_patch":
                self.pending.pop(0)
                self.clock_patch()
            elif left <= len(self.pending) + 2 * PAIRS + 1:
                # The tail: single ok rows until every planted row is placed.
                if self.pending and self.pending[0][1] == "clock_patch":
                    self.pending.pop(0)
                    self.clock_patch()
                else:
                    self.run_row("ok")
            else:
                x = rng.random()
                if x < 0.60:
                    self.verify_batch(PAIRS)
                elif x < 0.64:
                    self.verify_batch(0)
                elif x < 0.71:
                    self.verify_failed(rng.choice(("oom", "crash", "timeout")))
                elif x < 0.75:
                    self.verify_rejected()
                elif x < 0.93:
                    self.run_row("ok")
                else:
                    self.run_row(rng.choice(("oom", "crash", "timeout")))
        if self.pending:
            raise SystemExit(f"internal: {len(self.pending)} planted rows were not placed")


def build_ledger(tpl: Template, root: Path, n: int, seed: int, progress, old_fraction: float = 0.1) -> Built:
    state = root / "ws" / ".infrarsi"
    if state.exists():
        shutil.rmtree(state)
    state.mkdir(parents=True)
    key = KeyPair.generate()
    started = time.perf_counter()
    with Ledger.open(state / "ledger.db", key=key, create=True) as ledger:
        ledger.put_blob(tpl.contract_text, "contract")
        ledger.set_meta("contract_sha256", tpl.contract_hash)
        builder = Builder(tpl, ledger, n, random.Random(seed), progress, old_fraction)
        builder.build()
    build_s = time.perf_counter() - started
    return Built(
        state / "ledger.db",
        key.public_hex,
        builder.written,
        builder.planted,
        builder.variants.count,
        builder.by_status,
        build_s,
    )


# -- measuring -------------------------------------------------------------------------------


def raw_scan(path: Path) -> tuple[float, int]:
    """The floor: every execution row SELECTed, its receipts and evidence read and parsed."""
    started = time.perf_counter()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        blobs = conn.cursor()
        rows = conn.execute("SELECT * FROM executions ORDER BY id")
        names = [d[0] for d in rows.description]
        r_col, e_col = names.index("receipts_hash"), names.index("evidence_hash")
        count = 0
        for row in rows:
            count += 1
            if row[r_col]:
                got = blobs.execute("SELECT data FROM blobs WHERE hash = ?", [row[r_col]]).fetchone()
                if got is not None:
                    for line in bytes(got[0]).decode("utf-8", "replace").splitlines():
                        json.loads(line)
            if row[e_col]:
                got = blobs.execute("SELECT data FROM blobs WHERE hash = ?", [row[e_col]]).fetchone()
                if got is not None:
                    json.loads(bytes(got[0]))
    finally:
        conn.close()
    return time.perf_counter() - started, count


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants (the audit's worker processes), MB."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration, ValueError):
            continue
    return total / 1024


def run_audit(path: Path, key: str, rejudge_all: bool = False) -> tuple[float, float, int, dict, str]:
    """`infrarsi audit --json` in a subprocess: wall seconds, peak RSS (MB), exit code, report, stderr.

    The RSS is the larger of the audit process's own peak (rusage) and the peak of the whole
    process tree (it and its worker processes) sampled every 50 ms.
    """
    import threading

    cmd = [sys.executable, "-m", "infrarsi.cli", "audit", str(path), "--key", key, "--json"]
    if rejudge_all:
        cmd.append("--rejudge-all")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO)
        peak = [0.0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                peak[0] = max(peak[0], _tree_rss_mb(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (ru_maxrss in KiB)
        done.set()
        sampler.join()
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, stderr = out.read().decode(), err.read().decode("utf-8", "replace")
    try:
        report = json.loads(text) if text.strip() else {}
    except ValueError:
        report = {}
    return wall, max(usage.ru_maxrss / 1024, peak[0]), proc.returncode, report, stderr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executions", type=int, required=True, metavar="N")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    ap.add_argument("--keep", default=None, metavar="DIR", help="build in DIR and keep it (default: a temp dir)")
    ap.add_argument(
        "--template",
        default=None,
        metavar="DIR",
        help="the template workspace: built there if absent, reused if present",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--old-fraction",
        type=float,
        default=0.1,
        help="share of verify batches stored by an older rule version, re-judged from source "
        "(default 0.1); the planted audit cheats always are",
    )
    ap.add_argument("--rejudge-all", action="store_true", help="pass --rejudge-all to infrarsi audit")
    args = ap.parse_args(argv)
    if args.executions < 20:
        ap.error("--executions: at least 20 (5 planted rows of each of 4 kinds)")

    def log(msg: str) -> None:
        if not args.json:
            print(msg, file=sys.stderr, flush=True)

    def progress(done: int, total: int) -> None:
        log(f"  built {done:,}/{total:,} rows ({time.perf_counter() - build_start:.1f} s)")

    root = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="audit-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        tpl_dir = Path(args.template).resolve() if args.template else root / "template"
        tpl_ws = build_template(tpl_dir, log)
        tpl = load_template(tpl_ws)
        self_check(tpl, tpl_ws)
        log(f"building {args.executions:,} executions in {root / 'ws' / '.infrarsi' / 'ledger.db'}")
        build_start = time.perf_counter()
        built = build_ledger(tpl, root, args.executions, args.seed, None if args.json else progress, args.old_fraction)
        planted_ids = {i for ids in built.planted.values() for i in ids}
        log(
            f"built in {built.build_s:.1f} s ({1000 * built.build_s / built.executions:.2f} ms/row); "
            f"{built.patches} distinct patches; statuses {built.by_status}; "
            f"planted {{{', '.join(f'{k}: {len(v)}' for k, v in built.planted.items())}}}"
        )
        if args.keep:
            (root / "bench.json").write_text(
                json.dumps(
                    {
                        "ledger": str(built.path),
                        "public_key": built.public_key,
                        "executions": built.executions,
                        "patches": built.patches,
                        "by_status": built.by_status,
                        "planted": built.planted,
                    },
                    indent=1,
                )
            )

        scan_s, scanned = raw_scan(built.path)
        log(f"raw scan: {scanned:,} rows in {scan_s:.2f} s")
        log("auditing ...")
        audit_s, rss_mb, rc, report, stderr = run_audit(built.path, built.public_key, args.rejudge_all)
        if rc not in (0, 1) or not report:
            print(f"infrarsi audit failed (exit {rc}):\n{stderr[-4000:]}", file=sys.stderr)
            return 2
        findings = report.get("findings", [])
        found = {f["execution"] for f in findings}
        planted_found = len(planted_ids & found)
        result = {
            "executions": built.executions,
            "audit_s": round(audit_s, 3),
            "scan_s": round(scan_s, 3),
            "peak_rss_mb": round(rss_mb, 1),
            "findings": len(findings),
            "planted": len(planted_ids),
            "planted_found": planted_found,
            "build_s": round(built.build_s, 3),
            "ratio": round(audit_s / scan_s, 2) if scan_s > 0 else None,
            "sources": report.get("sources"),
            "rejudge_all": args.rejudge_all,
        }
        if args.json:
            print(json.dumps(result, sort_keys=True))
        else:
            print(
                f"{built.executions:,} executions: audit {audit_s:.2f} s, raw scan {scan_s:.2f} s "
                f"(ratio {result['ratio']}x; goal <= 10), audit peak RSS {rss_mb:.0f} MB (goal < 1024), "
                f"{len(findings)} findings, planted {planted_found}/{len(planted_ids)} found, "
                f"build {built.build_s:.1f} s"
            )
        ok = True
        honest = [f for f in findings if f["execution"] not in planted_ids]
        if honest:
            ok = False
            print(f"{len(honest)} finding(s) on honest rows, e.g.:", file=sys.stderr)
            for f in honest[:10]:
                print(f"  execution {f['execution']}: {f['check']} {f['status']}: {f['detail']}", file=sys.stderr)
        missed = {kind: sorted(set(ids) - found) for kind, ids in built.planted.items() if set(ids) - found}
        if missed:
            ok = False
            print(f"planted rows the audit did not find: {missed}", file=sys.stderr)
        if not report.get("chain_ok", False):
            ok = False
            print(f"the chain does not verify: {report.get('chain')}", file=sys.stderr)
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
