"""The scope `draft` guesses: what a patch may touch, and what is pinned."""

from __future__ import annotations

from pathlib import Path

__all__ = ["guess_scope"]

DATA_FOLDERS = ("data", "dataset", "datasets", "corpus")
CONFIG_FOLDERS = ("config", "configs", "conf")
DATA_SUFFIXES = (".csv", ".json", ".jsonl", ".txt", ".bin", ".npy", ".npz", ".pt", ".parquet", ".arrow", ".tsv")
CONFIG_SUFFIXES = (".yaml", ".yml", ".cfg", ".ini")
SKIPPED = {".infrarsi", ".git", "__pycache__", ".venv", "venv", "outputs", "runs", "wandb", "checkpoints"}


def _is_eval(path: str) -> bool:
    name = Path(path).name.lower()
    return name.startswith(("eval", "evaluate", "test_")) or "eval" in Path(path).stem.lower().split("_")


def guess_scope(script: Path, local_modules: list[str], args: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(editable globs, protected globs, why): the script and the local modules it imports are
    editable, except evaluation and data modules; data, evaluation and configuration files are
    protected, and so are config files the command line names."""
    root = script.parent
    editable, protected, why = [script.name], [], []
    pinned_folders = {f for f in (*DATA_FOLDERS, *CONFIG_FOLDERS) if (root / f).is_dir()}
    for module in local_modules:
        if Path(module).parts[0] in pinned_folders:
            continue  # under a protected folder: pinned with it, never editable
        if _is_eval(module) or Path(module).stem.lower() in ("data", "dataset", "datasets"):
            protected.append(module)
        elif module not in editable:
            editable.append(module)
    if len(editable) > 1:
        why.append(f"editable: the script and the local modules it imports ({', '.join(editable[1:])})")
    else:
        why.append("editable: the script (it imports no local module)")
    for folder in (*DATA_FOLDERS, *CONFIG_FOLDERS):
        if (root / folder).is_dir():
            protected.append(f"{folder}/**")
    for path in sorted(root.iterdir()):
        if path.name in SKIPPED or path.is_dir() or path == script or any(c in path.name for c in "*?[]{}!"):
            continue
        rel = path.name
        if path.suffix in DATA_SUFFIXES + CONFIG_SUFFIXES or (path.suffix == ".py" and _is_eval(rel)):
            protected.append(rel)
    for arg in args:  # config files on the command line (exec'd, or read as YAML) inside the workspace
        candidate = (root / arg).resolve()
        if arg.startswith("-") or "=" in arg or not candidate.is_file() or not candidate.is_relative_to(root):
            continue
        rel = candidate.relative_to(root).as_posix()
        if rel not in editable and not any(c in rel for c in "*?[]{}!"):
            if not any(rel.startswith(p.removesuffix("**")) for p in protected if p.endswith("/**")):
                protected.append(rel)
    protected = list(dict.fromkeys(p for p in protected if p not in editable))
    if protected:
        why.append(f"protected: data, evaluation and configuration ({', '.join(protected)})")
    return editable, protected, why
