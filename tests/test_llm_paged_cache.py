"""The paged KV cache on the built-in vlm-tiny, engines stepped by hand: prefix caching (a
repeated prompt, a follow-up turn, images), the LRU of cached blocks, sequences joining and
leaving without touching each other's blocks, and preemption when the pool runs out; seeded
answers the same every way."""

from __future__ import annotations

import logging

import pytest
import torch
from PIL import Image

from vidserve.chat import ChatImage
from vidserve.errors import InvalidRequest
from vidserve.options import RepetitionOptions
from vidserve.pipelines.llm.engine import LLMEngine
from vidserve.pipelines.llm.model import ChatModel
from vidserve.pipelines.llm.sequence import SamplingParams
from vidserve.registry import resolve_chat

SYSTEM = "You describe pictures for a video studio, in short plain sentences. " * 4  # ~280 tokens


@pytest.fixture(scope="module")
def model() -> ChatModel:
    return ChatModel.load(resolve_chat("vlm-tiny"))


def params(**kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 16, "seed": 0, "ignore_eos": True,
                             "repetition_detection": RepetitionOptions(enabled=False), **kw})


def picture(colour) -> ChatImage:
    return ChatImage(Image.new("RGB", (40, 30), colour), digest=f"paged-{colour}")


def conversation(model, image: ChatImage, *turns: tuple[str, str | None]):
    """System prompt, then user turns (the first with the image) and the answers given so far."""
    messages = [{"role": "system", "content": SYSTEM}]
    for i, (question, answer) in enumerate(turns):
        content = [{"type": "text", "text": question}]
        messages.append({"role": "user", "content": ([{"type": "image"}] if i == 0 else []) + content})
        if answer is not None:
            messages.append({"role": "assistant", "content": answer})
    return model.encode(messages, [image])


def finish(engine: LLMEngine, *seqs, steps: int = 500):
    for _ in range(steps):
        if all(s.finished for s in seqs):
            return seqs
        engine.step()
    raise AssertionError("the sequences did not finish")


def answer(engine: LLMEngine, prompt, **kw):
    return finish(engine, engine.submit(prompt, params(**kw)))[0]


@pytest.fixture
def count_image_features(model, monkeypatch):
    calls = []
    features = model.image_features
    monkeypatch.setattr(model, "image_features", lambda image: calls.append(image.digest) or features(image))
    return calls


def test_a_repeated_prompt_comes_from_the_cache_with_its_image_and_answers_the_same(model, count_image_features):
    engine = LLMEngine(model)
    prompt = conversation(model, picture((200, 30, 30)), ("What is in the picture?", None))
    first = answer(engine, prompt)
    assert first.cached_tokens == 0 and count_image_features == ["paged-(200, 30, 30)"]
    again = answer(engine, prompt)
    # All but the block holding the last prompt token (computed again for its logits).
    assert again.cached_tokens == (len(prompt.token_ids) - 1) // 16 * 16 >= 0.9 * len(prompt.token_ids)
    assert count_image_features == ["paged-(200, 30, 30)"]  # the image's tokens came cached: not even looked up
    uncached = answer(engine, prompt, prefix_cache=False)
    assert uncached.cached_tokens == 0 and len(count_image_features) == 2
    assert first.output_ids == again.output_ids == uncached.output_ids
    sampled = [answer(engine, prompt, temperature=1.0, seed=9, prefix_cache=cache).output_ids for cache in (1, 0)]
    assert sampled[0] == sampled[1]


def test_a_follow_up_turn_reuses_the_system_prompt_image_and_first_turn(model, count_image_features):
    engine = LLMEngine(model)
    image = picture((20, 160, 40))
    turn1 = conversation(model, image, ("What colour is it?", None))
    first = answer(engine, turn1)
    turn2 = conversation(model, image, ("What colour is it?", model.tokenizer.decode(first.output_ids)),
                         ("And its shape?", None))
    assert turn2.token_ids[:len(turn1.token_ids)] == turn1.token_ids
    second = answer(engine, turn2)
    assert second.cached_tokens >= (len(turn1.token_ids) - 1) // 16 * 16
    assert len(count_image_features) == 1  # the image was encoded once, for the first turn
    alone = answer(LLMEngine(model, prefix_cache=False), turn2)
    assert alone.cached_tokens == 0 and alone.output_ids == second.output_ids
    # Another image in the same place matches only the system prompt before it.
    other = answer(engine, conversation(model, picture((1, 2, 3)), ("What colour is it?", None)))
    image_start = turn1.image_spans[0].start
    assert other.cached_tokens == image_start // 16 * 16 < second.cached_tokens


def test_joining_and_leaving_moves_no_other_sequence_cache(model):
    engine = LLMEngine(model, prefill_tokens=32)
    running = engine.submit(conversation(model, picture((9, 9, 9)), ("Go on.", None)), params(max_tokens=120))
    while not running.output_ids:
        engine.step()
    table, written = list(running.block_table), running.computed - (len(running.block_table) - 1) * 16
    blocks = torch.tensor(table)
    before = [(k[blocks].clone(), v[blocks].clone()) for k, v in zip(engine.cache.keys, engine.cache.values)]
    others = [engine.submit(conversation(model, picture((i, 0, 0)), (f"Question {i}?", None)),
                            params(max_tokens=2 + 5 * i, seed=i)) for i in range(3)]
    finish(engine, *others)
    assert not running.finished and running.block_table[:len(table)] == table
    for (k, v), (k0, v0) in zip(zip(engine.cache.keys, engine.cache.values), before):
        assert torch.equal(k[blocks][:-1], k0[:-1]) and torch.equal(v[blocks][:-1], v0[:-1])
        assert torch.equal(k[blocks][-1][:written], k0[-1][:written])  # its last block, as far as it was filled
    finish(engine, running)
    alone = answer(LLMEngine(model, prefix_cache=False), running.prompt, max_tokens=120)
    assert alone.output_ids == running.output_ids


def test_unheld_cached_blocks_are_evicted_least_recently_released_first(model):
    engine = LLMEngine(model, kv_tokens=12 * 16)  # three prompts' worth of blocks
    prompts = {name: model.encode([{"role": "user", "content": name * 50}], []) for name in "XYZ"}
    assert all(len(p.token_ids) == 53 for p in prompts.values())  # 3 full blocks, and 5 tokens + 1 answer token
    for name in "XYZ":
        answer(engine, prompts[name], max_tokens=1)
    assert engine.blocks.in_use == 0 and engine.blocks.available == 12
    # Seven blocks: the three free ones (the partial last block of each), then X's, released first.
    answer(engine, model.encode([{"role": "user", "content": "W" * 100}], []), max_tokens=1)
    assert answer(engine, prompts["Z"], max_tokens=1).cached_tokens == 48
    assert answer(engine, prompts["X"], max_tokens=1).cached_tokens == 0


def test_a_pool_smaller_than_the_load_preempts_and_every_answer_is_the_same(model):
    prompts = [conversation(model, picture((30 * i, 90, 0)), (f"Tell me about it, {i}.", None)) for i in range(6)]
    work = [(p, params(max_tokens=40 + 8 * i, seed=i, temperature=1.0)) for i, p in enumerate(prompts)]

    def run(engine):
        return [s.output_ids for s in finish(engine, *[engine.submit(p, kw) for p, kw in work], steps=3000)], engine

    roomy, _ = run(LLMEngine(model, prefix_cache=False))
    for cache in (False, True):  # with the cache, a preempted sequence takes its own blocks back
        small, engine = run(LLMEngine(model, kv_tokens=2 * 360, prefix_cache=cache))
        assert engine.preemptions > 0 and small == roomy
        assert engine.blocks.in_use == 0


def test_a_request_the_pool_cannot_hold_is_refused(model, caplog):
    with caplog.at_level(logging.INFO, logger="vidserve.chat"):
        engine = LLMEngine(model, kv_tokens=64)
    assert "chat KV cache: 64 tokens in 4 blocks of 16" in caplog.text
    prompt = model.encode([{"role": "user", "content": "hello"}], [])
    with pytest.raises(InvalidRequest, match="KV cache") as refused:
        engine.submit(prompt, params(max_tokens=64 - len(prompt.token_ids) + 1))
    assert refused.value.code == "context_length_exceeded"
    assert answer(engine, prompt, max_tokens=64 - len(prompt.token_ids)).finish_reason == "length"


def test_a_burst_sharing_a_system_prompt_computes_it_once_and_decodes_it_once(model, monkeypatch):
    prompts = [conversation(model, picture((0, 40 * i, 0)), (f"Say {i}.", None)) for i in range(4)]
    steps = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda **inputs: steps.append(inputs["step"]) or forward(**inputs))

    def run(cascade: bool):
        engine = LLMEngine(model)
        engine.cascade = cascade
        return [s.output_ids for s in finish(engine, *[engine.submit(p, params(seed=i, temperature=1.0, max_tokens=24))
                                                       for i, p in enumerate(prompts)])]

    once = run(cascade=True)
    system_blocks = prompts[0].image_spans[0].start // 16
    prefilled = sum(piece.length for step in steps for piece in step.pieces)
    assert prefilled == sum(len(p.token_ids) for p in prompts) - 3 * system_blocks * 16  # the others waited for it
    shared = [step.shared_blocks for step in steps if step.shared_blocks is not None]
    assert shared and all(len(blocks) == system_blocks for blocks in shared)  # and read it once a step
    steps.clear()
    assert run(cascade=False) == once and all(step.shared_blocks is None for step in steps)
