"""`wan-shapes`: the architecture and the shared pieces of its two training runs.

A Wan2.2-TI2V-style model at shapes-world size: a causal `AutoencoderKLWan` (4x spatial,
4x temporal, 8 latent channels), a `WanTransformer3DModel` whose first latent frame may be
given clean with timestep 0 (diffusers' `expand_timesteps`: one model for text-to-video and
image-to-video), and a frozen, seeded UMT5 encoder over a word-level tokenizer of the
shapes-world vocabulary. `train_vae.py` trains the autoencoder, `train_wan.py` the
transformer on its latents; both write into WEIGHTS/wan-shapes, a plain diffusers folder.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

from vidserve.registry import WEIGHTS

from . import shapes_world as world

FOLDER = WEIGHTS / "wan-shapes"
SIZE, FRAMES = 64, 17  # 1 s at 16 fps: 5 latent frames of 16x16, 5x8x8 = 320 transformer tokens
LATENT_CHANNELS = 8
TEXT_TOKENS = 24  # the longest caption (two shapes) is 16 words + </s>
FLOW_SHIFT = 2.0
WORDS = sorted({*world.SHAPES, *world.COLOURS, *world.BACKGROUNDS, *world.MOTIONS, *world.EXTRA_MOTIONS,
                *world._SYNONYMS, "a", "an", "the", "and", "on", "moving", "standing", "background", "object",
                "shape", "video", "of", "in", "with", "to", "is", "going"})


def build_text_tokenizer() -> PreTrainedTokenizerFast:
    """One token per shapes-world word (lower-cased; anything else is <unk>): a caption is a few
    tokens, which a small frozen encoder can keep apart."""
    vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "<unk>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=TEXT_TOKENS)


def build_text_encoder(vocab_size: int, seed: int) -> UMT5EncoderModel:
    # Frozen at its seeded initialisation, as Wan keeps umT5 frozen: distinct words give
    # distinct features, and the transformer's text projection learns to read them.
    torch.manual_seed(seed)
    config = UMT5Config(vocab_size=vocab_size, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                        relative_attention_num_buckets=8, relative_attention_max_distance=32)
    return UMT5EncoderModel(config).eval()


def build_vae(seed: int) -> AutoencoderKLWan:
    torch.manual_seed(seed)
    return AutoencoderKLWan(
        base_dim=16, z_dim=LATENT_CHANNELS, dim_mult=[1, 2, 2], num_res_blocks=1, temperal_downsample=[True, True],
        attn_scales=[], scale_factor_spatial=4, scale_factor_temporal=4,
        latents_mean=[0.0] * LATENT_CHANNELS, latents_std=[1.0] * LATENT_CHANNELS,
    )


def build_transformer(seed: int) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64, in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS, text_dim=64, freq_dim=64, ffn_dim=512, num_layers=4, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=64,
    )


def deepen(model: WanTransformer3DModel, layers: int) -> WanTransformer3DModel:
    """The same model with `layers` more blocks, computing exactly what it did: each new block
    is a copy of one of the last blocks, placed after it, with the projections it adds to the
    residual stream zeroed. Training then goes on with more capacity from where it stood,
    and the copied attention starts from features that mean something."""
    blocks = list(model.blocks)
    if not 0 <= layers <= len(blocks):
        raise ValueError(f"can add 0 to {len(blocks)} blocks (copies of the last ones), not {layers}")
    for source in range(len(blocks) - 1, len(blocks) - 1 - layers, -1):
        block = copy.deepcopy(blocks[source])
        for out in (block.attn1.to_out[0], block.attn2.to_out[0], block.ffn.net[-1]):
            torch.nn.init.zeros_(out.weight)
            torch.nn.init.zeros_(out.bias)
        blocks.insert(source + 1, block)
    model.blocks = torch.nn.ModuleList(blocks)
    model.register_to_config(num_layers=len(blocks))
    return model


def build_scheduler() -> UniPCMultistepScheduler:
    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                                   flow_shift=FLOW_SHIFT)


def build_pipeline(vae: AutoencoderKLWan, transformer: WanTransformer3DModel, seed: int,
                   text_encoder: UMT5EncoderModel | None = None) -> WanPipeline:
    """The pipeline training saves; its text encoder is drawn from `seed` unless one is given
    (a resumed run must keep the encoder its transformer learned to read)."""
    tokenizer = build_text_tokenizer()
    if text_encoder is None:
        text_encoder = build_text_encoder(len(tokenizer), seed)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                       scheduler=build_scheduler(), expand_timesteps=True)


def to_tensor(clips: np.ndarray | list) -> torch.Tensor:
    """uint8 [B, F, H, W, 3] -> float [B, 3, F, H, W] in [-1, 1], the VAE's input."""
    x = torch.from_numpy(np.ascontiguousarray(np.stack(clips))).float()
    return x.permute(0, 4, 1, 2, 3) / 127.5 - 1.0


def to_clips(x: torch.Tensor) -> np.ndarray:
    """The VAE's output, float [B, 3, F, H, W] in [-1, 1] -> uint8 [B, F, H, W, 3]: to_tensor undone."""
    return ((x.clamp(-1, 1).permute(0, 2, 3, 4, 1) + 1) * 127.5).round().byte().cpu().numpy()


def latent_stats(vae: AutoencoderKLWan) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) [1, C, 1, 1, 1] the pipelines normalise latents with, from the VAE's config."""
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    return mean, std

