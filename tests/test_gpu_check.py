"""`vidserve check --gpu` where there is no GPU: one clear line, a non-zero exit, nothing else tried."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_and_fails():
    result = subprocess.run([sys.executable, "-m", "vidserve.cli", "check", "--gpu"], capture_output=True, text=True,
                            timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"FAIL gpu: no CUDA GPU visible to torch {torch.__version__} (CUDA build: {torch.version.cuda}); "
        "the GPU kernels cannot run here"]
    assert "check --gpu: FAILED" in result.stderr
