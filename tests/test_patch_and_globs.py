"""The diff reader and workspace globs: exact on known input, never a traceback on any input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from infrarsi._patch import parse_patch
from infrarsi.contract._globs import matches
from infrarsi.errors import PatchParseError
from infrarsi.runner._environment import is_secret, workload_env

GIT_DIFF = """\
diff --git a/model.py b/model.py
index 1111111..2222222 100644
--- a/model.py
+++ b/model.py
@@ -1,2 +1,2 @@
-x = 1
+x = 2
 y = 3
diff --git a/new.py b/new.py
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/new.py
@@ -0,0 +1 @@
+z = 1
diff --git a/data/old.bin b/data/old.bin
deleted file mode 100644
Binary files a/data/old.bin and /dev/null differ
diff --git a/eval.py b/eval2.py
similarity index 100%
rename from eval.py
rename to eval2.py
"""


def test_git_diff_changes():
    changes = parse_patch(GIT_DIFF)
    assert [(c.old, c.new) for c in changes] == [
        ("model.py", "model.py"),
        (None, "new.py"),
        ("data/old.bin", None),
        ("eval.py", "eval2.py"),
    ]
    assert changes[1].created and changes[2].deleted and changes[2].binary and changes[3].rename
    assert not changes[0].binary and changes[0].paths == ("model.py",)


def test_plain_diff_with_several_files():
    text = "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-1\n+2\n--- a/b.py\n+++ b/b.py\n@@ -1 +1 @@\n-1\n+2\n"
    assert [c.paths for c in parse_patch(text)] == [("a.py",), ("b.py",)]


def test_not_a_diff():
    with pytest.raises(PatchParseError, match="no file changes"):
        parse_patch("hello\nworld\n")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=40),
            st.sampled_from(
                [
                    "--- a/x.py",
                    "+++ b/x.py",
                    "diff --git a/x b/y",
                    "--- /dev/null",
                    "+++ /dev/null",
                    "new file mode 100644",
                    "rename from q",
                    "GIT binary patch",
                    "@@ -1 +1 @@",
                    '--- "a/sp ace"',
                ]
            ),
        ),
        max_size=30,
    )
)
def test_parse_patch_never_tracebacks(lines):
    try:
        changes = parse_patch("\n".join(lines))
    except PatchParseError:
        return
    assert changes and all(c.paths for c in changes)


@pytest.mark.parametrize(
    "path,glob,expected",
    [
        ("data/train.bin", "data/**", True),
        ("data/a/b/c.bin", "data/**", True),
        ("datax/a", "data/**", False),
        ("model.py", "*.py", True),
        ("pkg/model.py", "*.py", False),
        ("pkg/model.py", "**/*.py", True),
        ("model.py", "**/*.py", True),
        ("eval.py", "eval.py", True),
        ("eval.pyc", "eval.py", False),
        ("a/x1.py", "a/x?.py", True),
        ("a.b", "a?b", True),
        ("a/b", "a?b", False),
    ],
)
def test_globs(path, glob, expected):
    assert matches(path, glob) is expected


def test_secret_names():
    for name in (
        "OPENAI_API_KEY",
        "AWS_ACCESS_KEY_ID",
        "GITHUB_TOKEN",
        "X_SECRET",
        "HF_TOKEN",
        "DB_PASSWORD",
        "INFRARSI_KEY",
        "ANTHROPIC_API_KEY",
        "MY_AUTH_HEADER",
    ):
        assert is_secret(name), name
    for name in ("PATH", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "LANG"):
        assert not is_secret(name), name


def test_workload_env_is_an_allowlist():
    parent = {
        "PATH": "/bin",
        "RANDOM_THING": "1",
        "OPENAI_API_KEY": "k",
        "TORCH_API_KEY": "k",
        "OMP_NUM_THREADS": "2",
        "HOME": "/root",
    }
    env = workload_env(parent, home="/sandbox/home", extra={"INFRARSI_STEPS": "30", "KNOB": "x"})
    assert env["PATH"] == "/bin" and env["OMP_NUM_THREADS"] == "2" and env["HOME"] == "/sandbox/home"
    assert "RANDOM_THING" not in env and "OPENAI_API_KEY" not in env and "TORCH_API_KEY" not in env
    assert env["INFRARSI_STEPS"] == "30" and env["KNOB"] == "x"
