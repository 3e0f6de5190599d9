"""A Qwen2-VL at toy size for the M-RoPE tests: its ViT (patch 14, 2x2 patch merging),
M-RoPE decoder and processor, with a byte-level vocabulary under Qwen's special tokens and
chat markup. Built in code with seeded weights; no download."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from vidserve.pipelines.llm.model import MROPE_PROCESSORS  # the image-only processor the engine loads

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"]
QWEN_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_qwen2vl():
    """(Qwen2VLForConditionalGeneration, processor). Images are resized to 28..84 px a side
    (multiples of 28): a 56x56 picture is a 4x4 patch grid, 4 image tokens."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate([*QWEN_SPECIALS, *alphabet])}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>",
        extra_special_tokens=QWEN_SPECIALS[1:], model_max_length=2048, chat_template=QWEN_CHAT_TEMPLATE,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIALS}
    torch.manual_seed(0)
    # Weights larger than transformers' 0.02 default and a low rope theta, so that attention
    # is far from uniform and every (t, h, w) row rotates: wrong positions change the tokens.
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, initializer_range=0.15,
                # head_dim 16: 8 rotary frequencies, split over (t, h, w)
                rope_parameters={"rope_type": "default", "rope_theta": 100.0, "mrope_section": [2, 3, 3]},
                bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                           video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                           vision_end_token_id=ids["<|vision_end|>"])
    model = Qwen2VLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    image_processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=84 * 84)
    processor = MROPE_PROCESSORS["qwen2_vl"](image_processor, tokenizer, chat_template=QWEN_CHAT_TEMPLATE)
    return model, processor
