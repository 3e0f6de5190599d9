"""The LLM engine on a tiny Qwen2-VL: multimodal rotary positions (M-RoPE) in prefill and
decode, alone and batched with other sequences, checked token for token against
transformers' own `generate` on the same model."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
from PIL import Image

from vidserve.chat import ChatImage
from vidserve.options import RepetitionOptions
from vidserve.pipelines.llm.engine import LLMEngine
from vidserve.pipelines.llm.model import ChatModel
from vidserve.pipelines.llm.sequence import SamplingParams
from vidserve.registry import resolve_chat

from tiny_qwen2vl import build_tiny_qwen2vl

GREEDY = dict(temperature=0, repetition_detection=RepetitionOptions(enabled=False))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> ChatModel:
    folder = tmp_path_factory.mktemp("qwen2vl-tiny")
    hf_model, processor = build_tiny_qwen2vl()
    hf_model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return ChatModel.load(resolve_chat(str(folder)))  # as a real checkpoint loads


def request(text: str, image: ChatImage | None = None) -> tuple[list[dict], list[ChatImage]]:
    if image is None:
        return [{"role": "user", "content": text}], []
    return [{"role": "user", "content": [{"type": "text", "text": "see "}, {"type": "image"},
                                         {"type": "text", "text": text}]}], [image]


def picture(width: int, height: int, colour) -> ChatImage:
    return ChatImage(Image.new("RGB", (width, height), colour), digest=f"{width}x{height}-{colour}")


def reference(model: ChatModel, messages, images, max_tokens: int) -> list[int]:
    """transformers' greedy generate on the processor's full output (pixels, grids, token types)."""
    text = model.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = model.processor(text=text, images=[i.image for i in images] or None, add_special_tokens=False,
                             return_tensors="pt")
    out = model.model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def run(engine: LLMEngine, prompt, max_tokens: int):
    return engine.submit(prompt, SamplingParams(max_tokens=max_tokens, **GREEDY))


def finish(engine: LLMEngine, seqs) -> None:
    for _ in range(100):
        if all(s.finished for s in seqs):
            return
        engine.step()
    raise AssertionError("the sequences did not finish")


def test_image_prompt_matches_transformers_generate(model):
    messages, images = request("what is it?", picture(56, 84, (200, 30, 30)))
    prompt = model.encode(messages, images)
    # A 3x2 grid of merged patches takes 3 positions for its 6 tokens: text after it runs 3 behind.
    assert prompt.rope_delta == -3 and prompt.positions.shape == (3, len(prompt.token_ids))
    engine = LLMEngine(model)
    seq = run(engine, prompt, 12)
    finish(engine, [seq])
    expected = reference(model, messages, images, 12)
    assert len(expected) == 12
    assert seq.output_ids == expected


@pytest.mark.parametrize("prefill_tokens", [256, 7])
def test_batched_sequences_each_match_their_solo_generate(model, prefill_tokens):
    """Different lengths, image grids and rope deltas share prefill and decode steps; one
    joins a running batch, one leaves it early. With a 7-token prefill budget, prompts are
    cut mid-image and packed with the next prompt's start."""
    first = request("describe the picture, please", picture(56, 84, (200, 30, 30)))
    texts = request("a text-only question that is longer than the others")
    second = request("and this one?", picture(84, 84, (0, 90, 250)))
    engine = LLMEngine(model, prefill_tokens=prefill_tokens)
    a = run(engine, model.encode(*first), 12)
    engine.step()
    engine.step()  # `a` is running with 3 tokens when the others join it
    b = run(engine, model.encode(*texts), 12)
    c = run(engine, model.encode(*second), 6)
    finish(engine, [a, b, c])
    assert engine.decode_steps < 12 + 11 + 5  # they shared steps
    assert a.output_ids == reference(model, *first, 12)
    assert b.output_ids == reference(model, *texts, 12)
    assert c.output_ids == reference(model, *second, 6)


def test_text_requests_never_run_the_vision_tower(model):
    calls = []
    hook = model.model.model.visual.register_forward_hook(lambda *_: calls.append(1))
    try:
        engine = LLMEngine(model)
        prompt = model.encode(*request("only words here"))
        assert prompt.positions is None and prompt.rope_delta == 0
        finish(engine, [run(engine, prompt, 4), run(engine, model.encode(*request("and more")), 4)])
        assert calls == []
        finish(engine, [run(engine, model.encode(*request("?", picture(28, 28, (1, 2, 3)))), 4)])
        assert len(calls) == 1
    finally:
        hook.remove()


def test_other_multimodal_rope_models_are_refused(model):
    """Qwen3-VL & co. have M-RoPE too, computed differently: refused, not answered wrongly."""
    config = copy.copy(model.model.config)
    config.model_type = "qwen3_vl"
    other = SimpleNamespace(config=config, model=model.model.model, generation_config=model.model.generation_config)
    with pytest.raises(ValueError, match="multimodal rotary positions are not supported"):
        ChatModel(model.spec, other, model.processor, model.device)


def test_a_follow_up_turn_from_the_prefix_cache_matches_transformers_generate(model):
    """The second turn's image tokens, with their M-RoPE positions, come from the prefix cache,
    and its answer goes on from the cached positions as generate's does."""
    image = picture(84, 56, (30, 200, 90))
    messages, images = request("what colour is the picture? " * 3, image)
    engine = LLMEngine(model)
    first = run(engine, model.encode(messages, images), 6)
    finish(engine, [first])
    follow_up = messages + [{"role": "assistant", "content": model.tokenizer.decode(first.output_ids)},
                            {"role": "user", "content": [{"type": "text", "text": "and its shape?"}]}]
    calls = model.vision_calls
    prompt = model.encode(follow_up, images)
    second = run(engine, prompt, 8)
    finish(engine, [second])
    assert second.cached_tokens >= prompt.image_spans[0].stop and model.vision_calls == calls
    assert second.output_ids == reference(model, follow_up, images, 8)
