"""Sparse self-attention inside diffusers' Wan transformer.

A processor on every block's self-attention (`attn1`) computes q, k, v the way
diffusers' `WanAttnProcessor` does (projections, RMS norms, rotary embedding) and hands
them to `vidserve.kernels.sparse_attention` with the token grid of the current forward
pass. Cross-attention (`attn2`: text, and the image context of I2V) keeps diffusers'
own processor. A request with dense attention runs diffusers' processors untouched, so
dense output is exactly diffusers' output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers import WanTransformer3DModel

from vidserve.kernels import dense_attention, sparse_attention
from vidserve.options import AttentionOptions

try:  # private to diffusers, so it may move: fail here, naming it, not deep inside a generation
    from diffusers.models.transformers.transformer_wan import _get_qkv_projections
except ImportError as exc:
    import diffusers

    raise ImportError(f"diffusers {diffusers.__version__} has no transformer_wan._get_qkv_projections, which "
                      "vidserve's attention processors call; install a diffusers release that has it") from exc


@dataclass
class SparseAttentionState:
    """What the processors of one transformer share during a generation."""

    options: AttentionOptions
    grid: tuple[int, int, int] = (0, 0, 0)  # (F, H, W) tokens of the current forward pass
    step: int = 0  # denoising steps finished so far
    ran_sparse: bool = False  # whether any layer of this generation ran top-k

    def dense_for(self, layer: int) -> bool:
        f, h, w = self.grid
        return (self.step < self.options.dense_steps or layer < self.options.dense_layers
                or f * h * w < self.options.min_tokens)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Wan's rotary embedding on interleaved (even, odd) channel pairs, as diffusers applies it.
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class SparseSelfAttnProcessor:
    def __init__(self, state: SparseAttentionState, layer: int):
        self.state, self.layer = state, layer

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        query, key, value = _get_qkv_projections(attn, hidden_states, None)
        query, key = attn.norm_q(query), attn.norm_k(key)
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
        if rotary_emb is not None:
            query, key = _rotate(query, *rotary_emb), _rotate(key, *rotary_emb)
        # [B, L, heads, d] -> [B, heads, L, d], the layout of scaled_dot_product_attention
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))
        if self.state.dense_for(self.layer):
            out = dense_attention(query, key, value)
        else:
            o, self.state.ran_sparse = self.state.options, True
            out = sparse_attention(query, key, value, self.state.grid, density=o.density, tile=o.tile,
                                   neighbours=o.neighbours, sink=o.sink, selection=o.selection, mass=o.mass,
                                   min_density=o.min_density, max_density=o.max_density)
        out = out.transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


class SparseAttention:
    """Installs and removes top-k self-attention on one or two (Wan2.2 A14B) transformers."""

    def __init__(self, transformers: list[WanTransformer3DModel]):
        self.transformers = transformers
        self.state = SparseAttentionState(AttentionOptions())
        self._defaults = [[block.attn1.processor for block in t.blocks] for t in transformers]
        self._installed = False
        for transformer in transformers:
            transformer.register_forward_pre_hook(self._record_grid, with_kwargs=True)

    def _record_grid(self, transformer, args, kwargs):
        latents = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        pt, ph, pw = transformer.config.patch_size
        _, _, f, h, w = latents.shape
        self.state.grid = (f // pt, h // ph, w // pw)

    def configure(self, options: AttentionOptions) -> None:
        """Set this generation's options; called before each request."""
        self.state.options, self.state.step, self.state.ran_sparse = options, 0, False
        sparse = options.mode == "sparse"
        if sparse == self._installed:
            return
        for transformer, defaults in zip(self.transformers, self._defaults):
            for layer, block in enumerate(transformer.blocks):
                block.attn1.set_processor(SparseSelfAttnProcessor(self.state, layer) if sparse else defaults[layer])
        self._installed = sparse

    def step_done(self, steps: int) -> None:
        self.state.step = steps

    @property
    def effective(self) -> str:
        """What this generation's self-attention ran: "sparse" if any layer of any step did."""
        return "sparse" if self.state.ran_sparse else "dense"
