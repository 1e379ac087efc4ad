"""framework_write: the job writes neither into protected paths nor into the installed framework."""

from __future__ import annotations

import libcst as cst

from infrarsi.contract import matches_any

from .._rule import AuditContext, Example, Finding, Rule
from .._source import SourceModel, dotted, string_value

_WRITE_MODES = set("wax+")
# Calls that change the file named by their first (or, for copies and moves, last) path argument.
_PATH_WRITERS = {
    "write_text",
    "write_bytes",
    "unlink",
    "rename",
    "replace",
    "touch",
    "rmdir",
    "chmod",
    "truncate",
    "symlink_to",
    "hardlink_to",
}
_FUNCTION_WRITERS = {
    "os.remove": 0,
    "os.unlink": 0,
    "os.rename": 0,
    "os.replace": 0,
    "os.truncate": 0,
    "os.chmod": 0,
    "shutil.rmtree": 0,
    "shutil.copy": -1,
    "shutil.copyfile": -1,
    "shutil.copy2": -1,
    "shutil.move": -1,
    "shutil.copytree": -1,
    "torch.save": 1,
    "numpy.save": 0,
    "os.symlink": -1,
}
_CONTRACT = "infrarsi.toml"


def _path_text(source: SourceModel, expr: cst.CSTNode) -> str | None:
    """The literal path parts of an expression (``HERE / 'data' / 'x.bin'`` -> ``data/x.bin``)."""
    parts = [
        v
        for n in source.descendants(expr)
        if (v := string_value(n)) is not None and not isinstance(source.parent.get(n), cst.ConcatenatedString)
    ]
    if not parts:
        return None
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


class FrameworkWrite(Rule):
    id = "framework_write"
    message = "the job writes into a protected path or the installed framework"
    VALID = [
        Example("open(HERE / 'data' / 'corpus.txt', 'rb').read()\n", protected=("data/**",)),
        Example("with open('out/ckpt.pt', 'wb') as fh:\n    fh.write(blob)\n", protected=("data/**",)),
        Example("import torch\ntorch.save(model.state_dict(), 'checkpoints/last.pt')\n", protected=("data/**",)),
        "import infrarsi\nprint(infrarsi.__version__)\n",
    ]
    INVALID = [
        Example("with open(HERE / 'data' / 'corpus.txt', 'ab') as fh:\n    fh.write(b' ')\n", protected=("data/**",)),
        Example("from pathlib import Path\nPath('data/val.txt').write_text('')\n", protected=("data/**",)),
        Example("import shutil\nshutil.copy('mine.py', 'eval.py')\n", protected=("eval.py",)),
        "open('infrarsi.toml', 'w').write('')\n",
        "import infrarsi, os\nos.remove(os.path.join(os.path.dirname(infrarsi.__file__), 'probe.py'))\n",
        "import sys\ntarget = [p for p in sys.path if 'site-packages' in p][0]\n",
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        findings = []
        for node in source.of_type(cst.Attribute):
            if node.attr.value == "__file__" and source.resolves_to(node.value, "infrarsi"):
                findings.append(self.finding(source, node, f"`{source.code(node)}` locates the installed framework"))
        for node in source.of_type(cst.SimpleString):
            text = string_value(node) or ""
            if "site-packages" in text or "dist-packages" in text:
                findings.append(self.finding(source, node, f"{text!r} points into installed packages"))
        for call in source.of_type(cst.Call):
            target = self._written_path(source, call)
            if target is None:
                continue
            path = _path_text(source, target)
            if path and self._protected(path, ctx):
                findings.append(self.finding(source, call, f"writes to {path}, a protected path"))
        return findings

    def _written_path(self, source: SourceModel, call: cst.Call) -> cst.CSTNode | None:
        args = [a for a in call.args if a.keyword is None]
        if not args:
            return None
        func = call.func
        if dotted(func) == "open" or source.resolves_to(func, "io.open", "os.open"):
            mode = next(
                (a.value for a in call.args if a.keyword and a.keyword.value == "mode"),
                args[1].value if len(args) > 1 else None,
            )
            text = string_value(mode) if mode is not None else None
            return args[0].value if text and _WRITE_MODES & set(text) else None
        if isinstance(func, cst.Attribute) and func.attr.value == "open":  # Path(...).open("w")
            mode = args[0].value if args else None
            text = string_value(mode) if mode is not None else None
            return func.value if text and _WRITE_MODES & set(text) else None
        if isinstance(func, cst.Attribute) and func.attr.value in _PATH_WRITERS:
            return func.value
        for name, index in _FUNCTION_WRITERS.items():
            if source.resolves_to(func, name) and len(args) > (index if index >= 0 else -index - 1):
                return args[index].value
        return None

    def _protected(self, path: str, ctx: AuditContext) -> bool:
        pieces = path.split("/")
        for start in range(len(pieces)):
            tail = "/".join(pieces[start:])
            if tail == _CONTRACT or (ctx.protected and matches_any(tail, ctx.protected)):
                return True
        return False


RULE = FrameworkWrite()
