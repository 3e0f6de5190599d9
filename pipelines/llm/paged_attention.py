"""Attention over the paged KV cache, as a transformers attention implementation.

An engine step is one forward pass over a single row of tokens: first one token per decoding
sequence, then the prompt pieces being prefilled. Each layer's attention call writes the row's
new keys and values into their blocks, then reads each sequence's blocks back: gathered
(`index_select` of whole blocks) into SDPA. The decoding tokens attend in one batched call
(their contexts padded to the longest and masked, each group of query heads that shares a KV
head folded into the query axis); each prefill piece in a call of its own, causal over its
own new tokens when it has no past, masked over its gathered past and itself otherwise. So no
token attends to another sequence's keys, and no key is padded beyond one block per decoding
sequence. When the decoding sequences all begin with the same blocks (a shared system prompt,
from the prefix cache), those are read once: every decoding query attends to them in one call,
each sequence to its own blocks in another, and the two are joined by their log-sum-exps (cascade
attention; CPU only, where torch's flash kernel returns them). benchmarks/RESULTS.md, "Chat: paged
attention on CPU", has the figures that chose these paths over flex_attention and a per-sequence loop.

The model keeps this implementation: without a step (transformers' own `generate`, say) a call
is plain SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .kv_cache import KVCache
from .sequence import Piece

NAME = "vidserve_paged"


@dataclass(frozen=True)
class PagedStep:
    cache: KVCache
    slots: torch.Tensor  # [tokens]: where each column's keys and values go, block * block_size + offset
    decoding: int  # columns [0, decoding): one token per decoding sequence
    decode_blocks: torch.Tensor | None  # [decoding, most blocks]: each one's blocks after the shared ones, padded
    decode_mask: torch.Tensor | None  # [decoding, 1, 1, most blocks * block_size]: its real tokens there
    pieces: tuple[Piece, ...]  # the prompt pieces, laid out in the row (`at`; `blocks` and `mask` with a past)
    shared_blocks: torch.Tensor | None = None  # the blocks every decoding sequence begins with, read once

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scale: float | None) -> torch.Tensor:
        """query [1, heads, tokens, d], key/value [1, kv heads, tokens, d] -> [1, tokens, heads, d]."""
        heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[3]
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        keys.view(-1, kv_heads, dim).index_copy_(0, self.slots, key[0].transpose(0, 1))
        values.view(-1, kv_heads, dim).index_copy_(0, self.slots, value[0].transpose(0, 1))
        out = query.new_empty(1, query.shape[2], heads, dim)
        if self.decoding:
            n = self.decoding
            q = query[0, :, :n].transpose(0, 1).reshape(n, kv_heads, heads // kv_heads, dim)
            out[0, :n] = self._decode(q, keys, values, scale).reshape(n, heads, dim)
        for piece in self.pieces:
            columns = slice(piece.at, piece.at + piece.length)
            q = query[:, :, columns]
            if piece.blocks is None:
                o = F.scaled_dot_product_attention(q, key[:, :, columns], value[:, :, columns], is_causal=True,
                                                   scale=scale, enable_gqa=True)
            else:
                end = piece.start + piece.length
                k = _gather(keys, piece.blocks, 1)[:, :, :end]
                v = _gather(values, piece.blocks, 1)[:, :, :end]
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=piece.mask, scale=scale, enable_gqa=True)
            out[0, columns] = o[0].transpose(0, 1)
        return out


    def _decode(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None) -> torch.Tensor:
        """q [n, kv heads, group, d]: each decoding sequence's query heads, by the KV head they share."""
        n = q.shape[0]
        k, v = _gather(keys, self.decode_blocks, n), _gather(values, self.decode_blocks, n)
        if self.shared_blocks is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.decode_mask, scale=scale)
        # Cascade: the shared prefix once for every query, each sequence's own blocks apart; the two
        # softmaxes joined by their log-sum-exps.
        own, own_lse = _flash(q, k, v, self.decode_mask, scale)
        all_queries = q.transpose(0, 1).reshape(1, q.shape[1], -1, q.shape[3])
        shared, shared_lse = _flash(all_queries, _gather(keys, self.shared_blocks, 1),
                                    _gather(values, self.shared_blocks, 1), None, scale)
        shared = shared.view(q.shape[1], n, q.shape[2], q.shape[3]).transpose(0, 1)
        shared_lse = shared_lse.view(q.shape[1], n, q.shape[2]).transpose(0, 1)
        top = torch.maximum(own_lse, shared_lse)
        own_weight, shared_weight = (own_lse - top).exp()[..., None], (shared_lse - top).exp()[..., None]
        return (own * own_weight + shared * shared_weight) / (own_weight + shared_weight)


def cascade_supported(device: torch.device) -> bool:
    """Cascade decoding needs attention's log-sum-exp, which torch gives through its CPU flash kernel."""
    return device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def _flash(q, k, v, mask, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA's output and the log-sum-exp of each query's scores."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                         scale=scale)
    return out, lse


def _gather(pool: torch.Tensor, blocks: torch.Tensor, rows: int) -> torch.Tensor:
    """[rows, kv heads, tokens, d] from a [blocks, block_size, kv heads, d] pool."""
    gathered = pool.index_select(0, blocks.reshape(-1))
    return gathered.view(rows, -1, pool.shape[2], pool.shape[3]).transpose(1, 2)


def paged_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    step: PagedStep | None = kwargs.get("paged_step")
    if step is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return step.attend(module.layer_idx, query, key, value, scaling), None


AttentionInterface.register(NAME, paged_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # masks for calls without a step, as SDPA gets them
