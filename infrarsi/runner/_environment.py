"""The workload's environment: an allowlist, with secrets scrubbed even from allowed names."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

__all__ = ["workload_env", "is_secret"]

_ALLOW_EXACT = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "USER",
        "LOGNAME",
        "SHELL",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "CC",
        "CXX",
        "LD_LIBRARY_PATH",
    }
)
_ALLOW_PREFIX = (
    "LC_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "CUBLAS_",
    "CUDNN_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "TRITON_",
)
_SECRET = re.compile(
    r"(API_?KEY|TOKEN|SECRET|PASSW(OR)?D|CREDENTIAL|PRIVATE_?KEY|AUTH|SESSION|COOKIE)"
    r"|^(AWS_|OPENAI_|ANTHROPIC_|AZURE_|GOOGLE_|GCP_|GITHUB_|GH_|HF_|HUGGING|SSH_|GPG_|INFRARSI_)",
    re.IGNORECASE,
)


def is_secret(name: str) -> bool:
    """Whether an environment variable name looks like it carries a credential."""
    return bool(_SECRET.search(name))


def workload_env(parent: Mapping[str, str], *, home: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The environment a workload starts with: allowed, non-secret parent variables plus ``extra``.

    ``extra`` (knob variables and the runner's ``INFRARSI_*``) is set last and is
    not scrubbed: the contract names those variables explicitly.
    """
    env = {k: v for k, v in parent.items() if (k in _ALLOW_EXACT or k.startswith(_ALLOW_PREFIX)) and not is_secret(k)}
    env.update(HOME=home, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env.setdefault("PATH", os.defpath)
    env.update(extra)
    return env
