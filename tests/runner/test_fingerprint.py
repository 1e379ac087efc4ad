"""The environment fingerprint a receipt carries: read without importing torch or starting CUDA."""

from __future__ import annotations

import subprocess
import sys


def test_fingerprint_names_the_software_and_the_devices():
    import torch

    from infrarsi.runner._fingerprint import environment_fingerprint

    fp = environment_fingerprint()
    assert fp["torch"] == torch.__version__
    assert fp["torch_cuda"] == torch.version.cuda  # None on the CPU build
    assert isinstance(fp["gpus"], list) and ("driver" in fp) and fp["cpu_model"]


def test_fingerprint_does_not_import_torch():
    code = (
        "import sys; from infrarsi.runner._fingerprint import environment_fingerprint as f; f(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
