"""Random LoRA adapters for wan-tiny, written in each layout vidserve loads: diffusers' own,
Kohya's musubi-tuner's, and the original Wan module names (lightx2v, ComfyUI)."""

from __future__ import annotations

import re

import torch
from diffusers import WanPipeline
from peft import LoraConfig, get_peft_model_state_dict
from safetensors.torch import load_file, save_file

from vidserve.pipelines.tiny import build_tiny_pipeline
from vidserve.registry import MODELS

TINY = MODELS["wan-tiny"]
# Every layer Kohya/musubi files carry: self- and cross-attention projections and the FFN.
TARGETS = r"blocks\.\d+\.(attn1|attn2)\.(to_q|to_k|to_v|to_out\.0)|blocks\.\d+\.ffn\.net\.(0\.proj|2)"
RANK = 4


def random_lora(folder, seed: int, magnitude: float = 0.3):
    """A random adapter for wan-tiny in diffusers' own layout (what save_lora_weights writes)."""
    torch.manual_seed(seed)
    transformer = build_tiny_pipeline(TINY).transformer
    transformer.add_adapter(LoraConfig(r=RANK, lora_alpha=RANK, target_modules=TARGETS, init_lora_weights=False))
    state = {k: v * magnitude for k, v in get_peft_model_state_dict(transformer).items()}
    WanPipeline.save_lora_weights(folder, transformer_lora_layers=state)
    return folder / "pytorch_lora_weights.safetensors"


_MUSUBI = [(r"attn1\.to_out\.0", "self_attn_o"), (r"attn2\.to_out\.0", "cross_attn_o"),
           (r"attn1\.to_(q|k|v)", r"self_attn_\1"), (r"attn2\.to_(q|k|v)", r"cross_attn_\1"),
           (r"ffn\.net\.0\.proj", "ffn_0"), (r"ffn\.net\.2", "ffn_2")]


def as_musubi(diffusers_file, out):
    """The same adapter as Kohya's musubi-tuner writes it: lora_unet_blocks_0_self_attn_q.lora_down..."""
    converted = {}
    for key, tensor in load_file(diffusers_file).items():
        module, kind = re.fullmatch(r"transformer\.(.+)\.(lora_A|lora_B)\.weight", key).groups()
        for pattern, replacement in _MUSUBI:
            module = re.sub(pattern, replacement, module)
        name = "lora_unet_" + module.replace(".", "_")
        converted[f"{name}.{'lora_down' if kind == 'lora_A' else 'lora_up'}.weight"] = tensor
        if kind == "lora_A":
            converted[f"{name}.alpha"] = torch.tensor(float(tensor.shape[0]))  # alpha = rank: scale 1
    save_file(converted, out)
    return out


def as_original(diffusers_file, out):
    """The same adapter in the original Wan module names (lightx2v's and ComfyUI's layout)."""
    names = [(r"attn1\.to_out\.0", "self_attn.o"), (r"attn2\.to_out\.0", "cross_attn.o"),
             (r"attn1\.to_(q|k|v)", r"self_attn.\1"), (r"attn2\.to_(q|k|v)", r"cross_attn.\1"),
             (r"ffn\.net\.0\.proj", "ffn.0"), (r"ffn\.net\.2", "ffn.2")]
    converted = {}
    for key, tensor in load_file(diffusers_file).items():
        module, kind = re.fullmatch(r"transformer\.(.+)\.(lora_A|lora_B)\.weight", key).groups()
        for pattern, replacement in names:
            module = re.sub(pattern, replacement, module)
        converted[f"diffusion_model.{module}.{'lora_down' if kind == 'lora_A' else 'lora_up'}.weight"] = tensor
    save_file(converted, out)
    return out
