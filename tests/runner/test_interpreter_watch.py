"""The runner's watch over the interpreter's import folders: what a run leaves there is seen."""

from __future__ import annotations

import os
import py_compile
import struct
import sys
from pathlib import Path

import infrarsi
from infrarsi.runner._interpreter import EnvironmentWatch, import_roots
from infrarsi.verifiers import check_run_integrity


def test_added_changed_and_deleted_files_are_reported_and_additions_removed(tmp_path):
    packages, stdlib = tmp_path / "site-packages", tmp_path / "lib"
    (packages / "torch" / "__pycache__").mkdir(parents=True)
    stdlib.mkdir()
    (packages / "torch" / "optim.py").write_text("x = 1\n")
    (packages / "gone.py").write_text("y = 1\n")
    (stdlib / "os.py").write_text("z = 1\n")
    (stdlib / "json").mkdir()
    (stdlib / "json" / "decoder.py").write_text("w = 1\n")
    watch = EnvironmentWatch([packages], [stdlib])
    assert watch.after_run() == {
        "roots": [str(packages), str(stdlib)],
        "added": [],
        "changed": [],
        "deleted": [],
        "removed": [],
        "caches_removed": [],
    }
    (packages / "evil.pth").write_text("import evil\n")
    (stdlib / "sitecustomize.py").write_text("import evil\n")
    (packages / "torch" / "optim.py").write_text("x = 2  # slower\n")
    os.utime(packages / "torch" / "optim.py", ns=(1, 1))
    (packages / "gone.py").unlink()
    py_compile.compile(str(packages / "torch" / "optim.py"), doraise=True)  # a first import's cache: fine
    (stdlib / "deep").mkdir()  # a new package at the top: it could shadow one imported later
    (stdlib / "deep" / "__init__.py").write_text("")
    (stdlib / "json" / "decoder.py").write_text("w = 2\n")  # inside a package there: not watched
    seen = watch.after_run()
    assert seen["added"] == ["lib/deep", "lib/sitecustomize.py", "site-packages/evil.pth"]
    assert seen["removed"] == seen["added"] and not (packages / "evil.pth").exists()
    assert not (stdlib / "deep").exists()
    assert seen["changed"] == ["site-packages/torch/optim.py"] and seen["deleted"] == ["site-packages/gone.py"]
    assert watch.after_run()["added"] == []  # the next run starts from what is there now


def test_a_same_size_edit_with_its_modification_time_set_back_is_still_a_change(tmp_path):
    """Found red-teaming the watch: size and mtime alone miss an edit that keeps the size and
    restores the mtime with os.utime; the inode's change time can't be restored."""
    packages = tmp_path / "site-packages"
    packages.mkdir()
    target = packages / "optim.py"
    target.write_text("lr = 1\n")
    before = target.stat()
    watch = EnvironmentWatch([packages], [])
    target.write_text("lr = 9\n")  # the same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert target.stat().st_size == before.st_size and target.stat().st_mtime_ns == before.st_mtime_ns
    assert watch.after_run()["changed"] == ["site-packages/optim.py"]


def _forged_cache(source: Path, other_code: str) -> Path:
    """A bytecode cache for ``source`` that holds ``other_code``, its header stamped with the
    source's modification time and size (what Python checks before trusting it)."""
    staged = source.parent / "staged.py"
    staged.write_text(other_code)
    cache = source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
    cache.parent.mkdir(exist_ok=True)
    py_compile.compile(str(staged), cfile=str(cache), doraise=True)
    staged.unlink()
    data = bytearray(cache.read_bytes())
    st = source.stat()
    data[8:16] = struct.pack("<II", int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)
    cache.write_bytes(bytes(data))
    return cache


def test_every_bytecode_cache_a_run_writes_is_removed_and_a_forged_one_reported(tmp_path):
    """Found red-teaming the watch: a cache that carries its source's stamp but other code is
    what every later import runs, and was taken for a first import's cache. Checking it
    against the source is not enough (a second red team passed code-object equality with a
    huge stack size and with specialised opcodes), so none a run wrote is kept."""
    packages = tmp_path / "site-packages"
    (packages / "lib").mkdir(parents=True)
    honest_src, forged_src = packages / "lib" / "fast.py", packages / "lib" / "step.py"
    honest_src.write_text("def step():\n    return 1\n")
    forged_src.write_text("def step():\n    return 1\n")
    watch = EnvironmentWatch([packages], [])
    honest = Path(py_compile.compile(str(honest_src), doraise=True))  # as an import would write it
    forged = _forged_cache(forged_src, "import time\ndef step():\n    time.sleep(1)\n    return 1\n")
    seen = watch.after_run()
    assert seen["added"] == ["site-packages/lib/__pycache__/" + forged.name] and seen["removed"] == seen["added"]
    assert seen["caches_removed"] == ["site-packages/lib/__pycache__/" + honest.name]
    assert not forged.exists() and not honest.exists()
    # Code-object equality passes, the behaviour differs: removed all the same, not reported.
    import marshal

    data = bytearray(_forged_cache(forged_src, "def step():\n    return 1\n").read_bytes())
    code = marshal.loads(bytes(data[16:]))
    step = code.co_consts[0].replace(co_stacksize=2**17)
    data[16:] = marshal.dumps(code.replace(co_consts=(step, *code.co_consts[1:])))
    forged.write_bytes(bytes(data))
    seen = watch.after_run()
    assert seen["added"] == [] and seen["caches_removed"] == ["site-packages/lib/__pycache__/" + forged.name]
    assert not forged.exists()


def test_the_watched_folders_are_this_interpreters_and_the_frameworks_own():
    whole, top = import_roots()
    assert any(p.name in ("site-packages", "dist-packages") for p in whole) and top
    framework = Path(infrarsi.__file__).resolve().parent
    assert any(framework.is_relative_to(p) for p in whole)  # under site-packages, or listed itself


def test_a_changed_environment_fails_integrity_framework():
    base = {
        "protected_changed_before_run": [],
        "protected_changed_by_run": [],
        "framework_changed": [],
        "containment": {"version": 1, "strays": [], "subreaper": True, "root_lost": False},
    }
    checks = {c.id: c for c in check_run_integrity({**base, "environment_changed": ["site-packages/x.pth (added)"]})}
    assert checks["integrity.framework"].status == "fail" and "x.pth" in checks["integrity.framework"].detail
    clean = {c.id: c for c in check_run_integrity({**base, "environment_changed": []})}
    assert clean["integrity.framework"].status == "pass"
    older = {c.id: c for c in check_run_integrity(base)}
    assert older["integrity.framework"].status == "pass" and "not watched" in older["integrity.framework"].detail
