"""The embedded default models, built in code: no download, no network, seeded weights.

They are real diffusers/transformers components (`WanTransformer3DModel`,
`AutoencoderKLWan`, `UMT5EncoderModel`, a CLIP vision tower) at toy sizes, so every
code path a real checkpoint takes — loading, scheduling, callbacks, decoding — runs on
a CPU in seconds. Their frames are noise-like: they prove plumbing, not quality.
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline, WanTransformer3DModel
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    CLIPVisionModelWithProjection,
    PreTrainedTokenizerFast,
    UMT5Config,
    UMT5EncoderModel,
)

from vidserve.registry import ModelSpec

TEXT_DIM = 32
HEADS, HEAD_DIM = 2, 16


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer (256 byte tokens + T5's specials): any text, no training, no download."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(["<pad>", "</s>", "<unk>", *alphabet])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=512
    )


def _text_encoder(vocab_size: int) -> UMT5EncoderModel:
    torch.manual_seed(0)
    config = UMT5Config(
        vocab_size=vocab_size, d_model=TEXT_DIM, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=32,
    )
    return UMT5EncoderModel(config).eval()


def _transformer(in_channels: int, out_channels: int, image_dim: int | None = None) -> WanTransformer3DModel:
    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
        in_channels=in_channels, out_channels=out_channels, text_dim=TEXT_DIM, freq_dim=32, ffn_dim=64,
        num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        image_dim=image_dim, added_kv_proj_dim=HEADS * HEAD_DIM if image_dim else None,
    ).eval()


def _wan21_vae() -> AutoencoderKLWan:
    torch.manual_seed(0)
    return AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True]).eval()


def _wan22_vae(z_dim: int = 16) -> AutoencoderKLWan:
    """Wan2.2's layout: pixels patchified 2x2 (12 channels), residual blocks, 16x spatial stride."""
    torch.manual_seed(0)
    return AutoencoderKLWan(
        base_dim=8, decoder_base_dim=8, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
        patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
        latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
    ).eval()


def _scheduler(spec: ModelSpec) -> UniPCMultistepScheduler:
    # The scheduler real Wan checkpoints ship: UniPC over flow-matching sigmas.
    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                   num_train_timesteps=1000, flow_shift=spec.flow_shift)


def build_tiny_pipeline(spec: ModelSpec) -> WanPipeline | WanImageToVideoPipeline:
    tokenizer = build_tokenizer()
    common = dict(tokenizer=tokenizer, text_encoder=_text_encoder(len(tokenizer)), scheduler=_scheduler(spec))
    if spec.name == "wan-tiny":
        return WanPipeline(vae=_wan21_vae(), transformer=_transformer(16, 16), **common)
    if spec.name == "wan-tiny-i2v":
        torch.manual_seed(0)
        vision = CLIPVisionConfig(hidden_size=16, projection_dim=16, num_hidden_layers=2, num_attention_heads=2,
                                  image_size=32, intermediate_size=32, patch_size=8)
        return WanImageToVideoPipeline(
            vae=_wan21_vae(), transformer=_transformer(16 + 4 + 16, 16, image_dim=16),
            image_encoder=CLIPVisionModelWithProjection(vision).eval(),
            image_processor=CLIPImageProcessorPil(crop_size=32, size={"shortest_edge": 32}), **common,
        )
    if spec.name == "wan-tiny-ti2v":
        # Wan2.2 TI2V: one transformer; the first frame, when given, is a clean latent
        # frame whose timestep is zero (expand_timesteps), so no extra channels.
        return WanPipeline(vae=_wan22_vae(), transformer=_transformer(16, 16), expand_timesteps=True, **common)
    raise ValueError(f"no built-in model called {spec.name!r}")
