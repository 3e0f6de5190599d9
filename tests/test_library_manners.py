"""vidserve as a library: importing it leaves the process's logging and warnings as they were,
and what it borrows from diffusers' private code still has the shape it relies on."""

from __future__ import annotations

import subprocess
import sys

import torch
from diffusers import WanTransformer3DModel

from vidserve.pipelines.attention import _get_qkv_projections

# Run in a fresh interpreter, diffusers and transformers first (their own import-time settings
# are theirs). The deeper modules import other libraries that add warning filters of their own
# (torch, urllib3...), so for them only the logging is compared.
_SNAPSHOT = """
import logging, warnings
import diffusers, transformers, diffusers.utils.logging as dl, transformers.utils.logging as tl

def logging_state():
    levels = {name: logging.getLogger(name).level for name in ("diffusers", "transformers", "torchao", "torch")}
    return levels, dl.is_progress_bar_enabled(), tl.is_progress_bar_enabled()

filters, before = list(warnings.filters), logging_state()
import vidserve.pipelines
assert warnings.filters == filters and logging_state() == before, (logging_state(), before)
import vidserve.pipelines.video, vidserve.pipelines.attention, vidserve.pipelines.llm.engine
assert logging_state() == before, (logging_state(), before)
"""


def test_importing_the_pipelines_changes_no_logging_or_warning_setting():
    result = subprocess.run([sys.executable, "-c", _SNAPSHOT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_diffusers_private_qkv_helper_still_projects_as_wan_attention_does():
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                                        in_channels=4, out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32,
                                        num_layers=1, rope_max_seq_len=32).eval()
    attn = transformer.blocks[0].attn1
    hidden = torch.randn(1, 6, 16)
    with torch.no_grad():
        projected = _get_qkv_projections(attn, hidden, None)
        expected = (attn.to_q(hidden), attn.to_k(hidden), attn.to_v(hidden))
    assert len(projected) == 3 and all(torch.equal(p, e) for p, e in zip(projected, expected)), (
        "diffusers changed transformer_wan._get_qkv_projections: vidserve's sparse attention processor "
        "(pipelines/attention.py) must compute q, k and v another way")
