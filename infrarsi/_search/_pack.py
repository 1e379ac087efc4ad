"""Experience packs: what one ledger verified, carried to a later search as priors.

``infrarsi pack export`` writes the verified findings (candidates with valid
receipts: their knobs, patches and A/B speedups) and the effects seen in every
finished run (step time and peak memory relative to that run's baseline), with the
hardware and workload fingerprints they were measured on. ``--pack`` uses them in a
later search, on other hardware or a related workload: the verified findings
become starting points, their patches become proposals (screened like any other),
and the relative effects enter the speed model as down-weighted pseudo-runs. A
pack never stands in for a measurement: nothing is promoted without its own receipt.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from infrarsi._search.strategy._space import Point, Space
from infrarsi.errors import UsageError

__all__ = ["export_pack", "load_pack", "suggestions", "prior_runs", "PACK_VERSION"]

PACK_VERSION = 1


def export_pack(contract_path: str | Path = "infrarsi.toml", out: str | Path | None = None) -> tuple[Path, dict]:
    """Write what this workspace's ledger verified (findings with receipts, the runs behind them,
    the hardware) as an experience pack, default ``.infrarsi/pack.json``; returns its path and body."""
    from infrarsi._receipt import verify_receipt
    from infrarsi._workspace import open_workspace

    with open_workspace(contract_path) as ws:
        contract = ws.contract
        findings, hardware = [], {}
        for path in sorted((contract.state_dir / "receipts").glob("*.json")):
            check = verify_receipt(path)
            if not check.ok:
                continue
            body = json.loads(path.read_text())["receipt"]
            hardware = hardware or body.get("environment", {})
            texts, names = {}, []
            for patch in body.get("patches", []):
                name = _pack_name(contract, patch)
                names.append(name)
                data = ws.ledger.get_blob(patch["sha256"])
                if data is not None:
                    texts[name] = data.decode("utf-8", "replace")
            findings.append(
                {
                    "knobs": body["knobs"],
                    "patches": names,
                    "speedup": body["speedup"],
                    "receipt": json.loads(path.read_text())["id"],
                    "patch_texts": texts,
                }
            )
        findings.sort(key=lambda f: -f["speedup"]["median"])
        runs = []
        baselines: dict[int, dict] = {}
        for row in ws.ledger.executions():
            # Judged runs only (a search's exploration, a verify's candidate run): `run` rows are unchecked.
            if row.get("kind") not in ("search", "verify") or row["status"] not in ("ok", "oom", "crash"):
                continue
            if str(row.get("detail", "")).startswith("interrupted"):
                continue
            bid = row.get("baseline_id")
            summary = baselines.get(bid) if bid is not None else None
            if bid is not None and summary is None:
                stored = ws.ledger.baseline(bid)
                summary = baselines[bid] = stored["summary"] if stored else {}
            if summary is None:
                stored = ws.ledger.latest_baseline()
                summary = stored["summary"] if stored else {}
            base_t = (summary.get("step_time_s") or {}).get("median")
            base_m = summary.get("peak_mem_mb")
            runs.append(
                {
                    "knobs": row.get("knobs") or {},
                    "patches": [_pack_name(contract, p) for p in row.get("patches") or []],
                    "status": row["status"],
                    "time_ratio": (row["step_time_s"] / base_t) if row.get("step_time_s") and base_t else None,
                    "mem_ratio": (row["peak_mem_mb"] / base_m) if row.get("peak_mem_mb") and base_m else None,
                }
            )
        stored = ws.ledger.latest_baseline()
        pack = {
            "version": PACK_VERSION,
            "kind": "infrarsi-pack",
            "workload": {
                "name": contract.task.name,
                "command": list(contract.task.command),
                "contract_sha256": contract.sha256,
                "knobs": {k: list(v.choices) for k, v in contract.knobs.items()},
            },
            "hardware": hardware,
            "baseline": {
                "step_time_s": stored["summary"]["step_time_s"]["median"] if stored else None,
                "peak_mem_mb": stored["summary"].get("peak_mem_mb") if stored else None,
            },
            "findings": findings,
            "runs": runs,
        }
        target = Path(out) if out else contract.state_dir / "pack.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(pack, indent=2, sort_keys=True) + "\n")
        return target, pack


def _pack_name(contract, patch: dict) -> str:
    """A contract patch keeps its name (when its text is the contract's); any other is named by its
    text's hash, since names like ``llm:1`` mean nothing outside the search that made them."""
    spec = contract.patch(patch["name"])
    if spec is not None:
        import hashlib

        if hashlib.sha256(spec.path.read_bytes()).hexdigest() == patch["sha256"]:
            return patch["name"]
    return f"pack:{patch['sha256'][:12]}"


def _fail(path, where: str, expected: str) -> None:
    raise UsageError(f"{path}: {where}: expected {expected}")


def load_pack(path: str | Path) -> dict:
    """Read and validate a pack; any problem is a UsageError naming the place and what was expected."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--pack {path}: cannot read it: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"--pack {path}: not a JSON pack: {exc}") from None
    return validate_pack(data, path)


def validate_pack(data, path) -> dict:
    if not isinstance(data, dict) or data.get("kind") != "infrarsi-pack":
        _fail(path, "kind", 'an object with "kind": "infrarsi-pack"')
    if data.get("version") != PACK_VERSION:
        _fail(path, "version", f"{PACK_VERSION}")
    for key in ("findings", "runs"):
        if not isinstance(data.get(key, []), list):
            _fail(path, key, "a list")
    for i, f in enumerate(data.get("findings", [])):
        if not isinstance(f, dict) or not isinstance(f.get("knobs"), dict) or not isinstance(f.get("patches"), list):
            _fail(path, f"findings[{i}]", "an object with knobs (object) and patches (list)")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in f["knobs"].items()):
            _fail(path, f"findings[{i}].knobs", "knob names mapped to choice strings")
        if not all(isinstance(p, str) for p in f["patches"]):
            _fail(path, f"findings[{i}].patches", "a list of patch names")
        sp = f.get("speedup")
        if not isinstance(sp, dict) or not _number(sp.get("median")):
            _fail(path, f"findings[{i}].speedup", "an object with a numeric median")
        texts = f.get("patch_texts", {})
        if not isinstance(texts, dict) or not all(isinstance(v, str) for v in texts.values()):
            _fail(path, f"findings[{i}].patch_texts", "patch names mapped to diff text")
    for i, r in enumerate(data.get("runs", [])):
        if (
            not isinstance(r, dict)
            or not isinstance(r.get("knobs"), dict)
            or not isinstance(r.get("patches"), list)
            or r.get("status") not in ("ok", "oom", "crash")
        ):
            _fail(path, f"runs[{i}]", "an object with knobs, patches and status ok|oom|crash")
        if r.get("time_ratio") is not None and not (_number(r["time_ratio"]) and r["time_ratio"] > 0):
            _fail(path, f"runs[{i}].time_ratio", "a positive number or null")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in r["knobs"].items()):
            _fail(path, f"runs[{i}].knobs", "knob names mapped to choice strings")
        if not all(isinstance(p, str) for p in r["patches"]):
            _fail(path, f"runs[{i}].patches", "a list of patch names")
    return data


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _map(space: Space, knobs: dict, patches: list, aliases: dict | None = None) -> Point | None:
    """The pack's candidate in this space; None if it needs a knob value or patch this space lacks.
    ``aliases`` maps a pack patch to the name its identical text has here."""
    patches = [(aliases or {}).get(p, p) for p in patches]
    for name, value in knobs.items():
        if name not in space.knobs or value not in space.knobs[name][0]:
            return None
    if any(p not in space.patches for p in patches):
        return None
    return space.point(knobs, patches)


def suggestions(pack: dict, space: Space, aliases: dict | None = None) -> list[Point]:
    """The pack's verified findings that exist in this space, fastest first."""
    out = []
    for finding in pack.get("findings", []):
        point = _map(space, finding["knobs"], finding["patches"], aliases)
        if point is not None and point not in out:
            out.append(point)
    return out


def pack_patches(pack: dict) -> dict[str, str]:
    """Patch texts the pack's verified findings used, by name (proposals for this search)."""
    out: dict[str, str] = {}
    for finding in pack.get("findings", []):
        out.update(finding.get("patch_texts", {}))
    return out


def prior_runs(
    pack: dict, space: Space, baseline_step_s: float, aliases: dict | None = None
) -> list[tuple[Point, float]]:
    """Pseudo-runs for the speed model: the pack's relative step times on our baseline's scale."""
    out = []
    for run in pack.get("runs", []):
        if run["status"] != "ok" or not run.get("time_ratio"):
            continue
        point = _map(space, run["knobs"], run["patches"], aliases)
        if point is not None:
            out.append((point, baseline_step_s * run["time_ratio"]))
    return out
