"""`vlm-shapes`: the LLM path's architecture (CLIP tower + MLP projector + Llama decoder, as
`LlavaForConditionalGeneration`) at shapes-world size, and the questions it is trained on.

The tokenizer is byte-level BPE (any text encodes) with merges learnt from the question and
answer templates, so the words of the shapes world are one token each; the chat template
and special tokens are vlm-tiny's, so the engine serves both the same way.
"""

from __future__ import annotations

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (CLIPVisionConfig, LlamaConfig, LlavaForConditionalGeneration, LlavaProcessor,
                          PreTrainedTokenizerFast)

from vidserve.pipelines.llm.tiny import CHAT_TEMPLATE, SPECIALS, assemble_llava
from vidserve.registry import WEIGHTS

from . import shapes_world as world

FOLDER = WEIGHTS / "vlm-shapes"
IMAGE_SIZE, PATCH = 64, 8  # 64 image tokens
DESCRIBE = ("Describe the image.", "What is in this picture?", "What do you see?", "Caption this frame.")


def describe(spec: world.ClipSpec) -> str:
    """What a still frame shows (no motion): "a red circle and a blue square on a gray background"."""
    objects = [f"{'an' if o.colour[0] in 'aeiou' else 'a'} {o.colour} {o.shape}" for o in spec.objects]
    return " and ".join(objects) + f" on a {spec.background} background"


def questions(spec: world.ClipSpec, rng: np.random.Generator) -> tuple[str, str]:
    """One (question, answer) about the frame."""
    obj = spec.objects[rng.integers(len(spec.objects))]
    kind = rng.integers(6)
    if kind == 0:
        return f"What colour is the {obj.shape}?", obj.colour
    if kind == 1:
        return f"What color is the {obj.shape}?", obj.colour
    if kind == 2:
        return (f"What shape is the {obj.colour} object?", obj.shape) if len(spec.objects) > 1 or rng.random() < 0.5 \
            else ("What shape is it?", obj.shape)
    if kind == 3:
        return "What colour is the background?", spec.background
    if kind == 4:
        return "How many shapes are there?", ("one", "two")[len(spec.objects) - 1]
    return DESCRIBE[rng.integers(len(DESCRIBE))], describe(spec)


def corpus() -> list[str]:
    """Every word the questions and answers use, in their usual contexts: what BPE learns merges from."""
    rng = np.random.default_rng(0)
    specs = world.sample_specs(600, 0, frames=17, two_shapes=0.3)
    specs += [world.repaint(s, rng) for s in specs[:300]]
    return [text for s in specs for _ in range(3) for text in questions(s, rng)] + list(DESCRIBE)


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="<|end|>", unk_token="<unk>",
        extra_special_tokens=SPECIALS[3:7], model_max_length=2048, chat_template=CHAT_TEMPLATE,
    )


def build(seed: int) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    vision = CLIPVisionConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
                              image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=96)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    return assemble_llava(tokenizer, vision, text, IMAGE_SIZE, PATCH)


def pixel_values(processor: LlavaProcessor, frames: np.ndarray) -> torch.Tensor:
    """What processor.image_processor makes of uint8 [N, IMAGE_SIZE, IMAGE_SIZE, 3] frames (at
    this size resize and crop keep them as they are), without a PIL round trip per frame."""
    images = processor.image_processor
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (images.image_mean, images.image_std))
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() * images.rescale_factor
    return (x - mean) / std


def user_message(question: str, image_first: bool = True) -> list[dict]:
    parts = [{"type": "image"}, {"type": "text", "text": question}]
    return [{"role": "user", "content": parts if image_first else parts[::-1]}]
