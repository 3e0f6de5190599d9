"""`vlm-tiny`, the embedded default chat model, built in code: no download, seeded weights.

A real LLaVA-style model at toy size — a CLIP vision tower, an MLP projector and a
Llama decoder (`LlavaForConditionalGeneration`) — with a byte-level tokenizer made with
`tokenizers` and a chat template, so every path a real checkpoint takes (processor,
chat template, image features, KV cache, sampling) runs on a CPU in milliseconds.
Its words are random bytes: it proves plumbing, not quality.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

SPECIALS = ["<pad>", "<s>", "<unk>", "<image>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
IMAGE_SIZE, PATCH = 32, 8  # 16 image tokens per picture

# Content is a string or OpenAI-style parts; an image part becomes the processor's
# <image> placeholder, which it expands to one token per image feature.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_chat_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens plus chat specials: encodes any text, needs no training."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *alphabet])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="<|end|>", unk_token="<unk>",
        extra_special_tokens=SPECIALS[3:7], model_max_length=2048, chat_template=CHAT_TEMPLATE,
    )


def build_tiny_vlm() -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    tokenizer = build_chat_tokenizer()
    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=32)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
                       # Sharper attention and faster-turning rotary phases than the defaults, so
                       # that a wrong position id changes the tokens (tests rely on it).
                       initializer_range=0.15, rope_parameters={"rope_type": "default", "rope_theta": 100.0})
    model, processor = assemble_llava(tokenizer, vision, text, IMAGE_SIZE, PATCH)
    return model.eval(), processor


def assemble_llava(tokenizer, vision: CLIPVisionConfig, text: LlamaConfig, image_size: int,
                   patch: int) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """A LLaVA model (CLIP tower, MLP projector, Llama) and its processor, with our chat template;
    the model's weights are drawn from torch's current random state."""
    config = LlavaConfig(vision_config=vision, text_config=text,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                         vision_feature_layer=-1, vision_feature_select_strategy="default")
    model = LlavaForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(crop_size=image_size, size={"shortest_edge": image_size}),
        tokenizer=tokenizer, patch_size=patch, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE,
    )
    return model, processor
