"""The LLM engine on the built-in vlm-tiny: continuous batching, the vision encoder
skipped for text, loop detection, structured outputs, stop strings, seeds, aborts."""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest
from PIL import Image
from polling import eventually

from vidserve.chat import ChatImage
from vidserve.errors import EngineOverloaded, InvalidRequest
from vidserve.options import RepetitionOptions
from vidserve.pipelines.llm.engine import LLMEngine
from vidserve.pipelines.llm.model import ChatModel
from vidserve.pipelines.llm.sequence import SamplingParams
from vidserve.registry import resolve_chat

NO_LOOP_CHECK = RepetitionOptions(enabled=False)


@pytest.fixture(scope="module")
def model() -> ChatModel:
    return ChatModel.load(resolve_chat("vlm-tiny"))


@pytest.fixture
def engine(model):
    engine = LLMEngine(model)
    engine.start()
    yield engine
    engine.stop()


def text_prompt(model, text="hello there"):
    return model.encode([{"role": "user", "content": text}], [])


def image_prompt(model, colour=(200, 30, 30)):
    image = ChatImage(Image.new("RGB", (40, 30), colour), digest=f"test-{colour}")
    return model.encode([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}], [image])


def params(**kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 24, "seed": 0, "repetition_detection": NO_LOOP_CHECK, **kw})


def collect(seqs_outputs):
    return {key: "".join(o.text for o in outs) for key, outs in seqs_outputs.items()}


def test_text_requests_never_run_the_vision_encoder_and_images_are_encoded_once(engine, model):
    calls = []
    hook = model.model.model.vision_tower.register_forward_hook(lambda *_: calls.append(1))
    try:
        for text in ("hi", "a longer question about nothing"):
            engine.generate(text_prompt(model, text), params())
        assert calls == []
        red = image_prompt(model)
        engine.generate(red, params())
        assert len(calls) == 1
        engine.generate(red, params(seed=5))  # same image: features come from the cache
        assert len(calls) == 1
        engine.generate(image_prompt(model, (0, 0, 255)), params())
        assert len(calls) == 2
    finally:
        hook.remove()


def test_image_changes_the_answer(engine, model):
    red, _ = engine.generate(image_prompt(model, (255, 0, 0)), params(temperature=0))
    blue, _ = engine.generate(image_prompt(model, (0, 0, 255)), params(temperature=0))
    assert red != blue


def test_eight_concurrent_requests_share_decode_steps_and_match_solo_runs(model):
    engine = LLMEngine(model, max_running=8)
    outputs = {i: [] for i in range(8)}
    prompts = [text_prompt(model, "abcdefgh"[i] * (3 + 7 * i)) for i in range(8)]  # different lengths, no prefix shared
    for i in range(8):  # all queued before the loop starts: they are admitted together
        engine.submit(prompts[i], params(max_tokens=32, seed=i, ignore_eos=True), on_output=outputs[i].append)
    engine.start()
    try:
        eventually(lambda: all(outs and outs[-1].finished for outs in outputs.values()), what="all eight")
        assert all(outs[-1].completion_tokens == 32 for outs in outputs.values())
        # 8 x 31 decoded tokens (the first comes from the prefill) in 31 shared steps, not 248.
        assert engine.decode_steps == 31
        assert engine.decoded_tokens == 8 * 31
        batched = collect(outputs)
        for i in (0, 5, 7):
            solo, _ = engine.generate(prompts[i], params(max_tokens=32, seed=i, ignore_eos=True))
            assert solo == batched[i]
    finally:
        engine.stop()


def test_sequences_join_and_leave_between_steps_without_changing_results(engine, model):
    prompts = [text_prompt(model, f"question {i} " * (i + 1)) for i in range(4)]
    lengths = [5, 40, 12, 30]
    solo = [engine.generate(p, params(max_tokens=n, seed=i, ignore_eos=True))[0]
            for i, (p, n) in enumerate(zip(prompts, lengths))]
    results = [None] * 4

    def run(i):
        results[i] = engine.generate(prompts[i], params(max_tokens=lengths[i], seed=i, ignore_eos=True))[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        steps = engine.decode_steps
        t.start()
        # Staggered arrivals: the next comes only after a decode step since this one, so some join mid-run.
        eventually(lambda: engine.decode_steps > steps, interval=0.001, what="the request to start decoding")
    for t in threads:
        t.join()
    assert results == solo


def record_steps(model, monkeypatch) -> list:
    """Each forward pass's (decoding tokens, [(prompt start, tokens) of each prefill piece])."""
    steps = []
    forward = model.forward

    def recording(**inputs):
        steps.append((inputs["step"].decoding, [(p.start, p.length) for p in inputs["step"].pieces]))
        return forward(**inputs)

    monkeypatch.setattr(model, "forward", recording)
    return steps


def test_a_prompt_past_the_prefill_budget_is_cut_across_steps_while_the_batch_keeps_decoding(model, monkeypatch):
    engine = LLMEngine(model, prefill_tokens=16)  # stepped by hand
    steps = record_steps(model, monkeypatch)
    # Two decoding, one prompt waiting: no burst, 16 prompt tokens a step.
    running = [engine.submit(text_prompt(model, text), params(max_tokens=200, ignore_eos=True)) for text in "ab"]
    engine.step()
    assert all(seq.output_ids for seq in running)  # prefilled and decoding
    long_prompt = text_prompt(model, "a long question " * 8)
    assert len(long_prompt.token_ids) > 16 * 6
    long = engine.submit(long_prompt, params(max_tokens=8, seed=3, ignore_eos=True))
    steps.clear()
    while not long.output_ids:
        before = [len(seq.output_ids) for seq in running]
        engine.step()
        assert [len(seq.output_ids) for seq in running] == [n + 1 for n in before]  # every step decoded them
    assert len(steps) == -(-len(long_prompt.token_ids) // 16)
    assert all(decoding == 2 and sum(n for _, n in pieces) <= 16 for decoding, pieces in steps)
    assert [start for _, pieces in steps for start, _ in pieces] == list(range(0, len(long_prompt.token_ids), 16))
    while not long.finished:
        engine.step()
    monkeypatch.undo()

    solo = LLMEngine(model)  # the whole prompt in one pass
    alone = solo.submit(long_prompt, params(max_tokens=8, seed=3, ignore_eos=True))
    while not alone.finished:
        solo.step()
    assert long.output_ids == alone.output_ids


def test_prompts_arriving_together_are_packed_into_one_row_and_answer_as_alone(model, monkeypatch):
    engine = LLMEngine(model, prefill_tokens=12)  # stepped by hand; nothing decodes at first
    steps = record_steps(model, monkeypatch)
    # The first step (a burst: 8 budgets) packs the first prompts and cuts one; the cut one
    # finishes in a later step, beside the decoding others, at most 12 prompt tokens a step.
    prompts = [text_prompt(model, letter * n) for letter, n in zip("pqrstuv", (17, 2, 30, 5, 9, 1, 40))]
    seqs = [engine.submit(p, params(max_tokens=6, seed=i, ignore_eos=True)) for i, p in enumerate(prompts)]
    while not all(s.finished for s in seqs):
        engine.step()
    assert len(steps[0][1]) > 1 and sum(n for _, n in steps[0][1]) == 12 * 8
    assert any(decoding and any(start > 0 for start, _ in pieces) for decoding, pieces in steps[1:])
    assert all(sum(n for _, n in pieces) <= 12 for decoding, pieces in steps[1:] if decoding)
    monkeypatch.undo()
    for i, prompt in enumerate(prompts):
        solo = LLMEngine(model)
        alone = solo.submit(prompt, params(max_tokens=6, seed=i, ignore_eos=True))
        while not alone.finished:
            solo.step()
        assert seqs[i].output_ids == alone.output_ids, i


def test_a_part_prefilled_sequence_can_be_aborted(model):
    engine = LLMEngine(model, prefill_tokens=4)
    running = engine.submit(text_prompt(model, "hi"), params(max_tokens=2000, ignore_eos=True))
    engine.step()  # nothing was decoding: prefilled whole
    outputs = []
    seq = engine.submit(text_prompt(model, "several words of prompt " * 3), params(), on_output=outputs.append)
    engine.step()
    assert not seq.output_ids and len(engine.prefill) == 1  # cut after 8 x 4 tokens (a burst: 1 waits, 1 decodes)
    engine.abort(seq)
    engine.abort(running)
    engine.step()
    assert outputs[-1].finish_reason == "abort" and engine.running == 0
    engine.start()
    try:
        _, out = engine.generate(text_prompt(model), params(max_tokens=3, ignore_eos=True), timeout=10)
        assert out.completion_tokens == 3
    finally:
        engine.stop()


def test_starting_twice_runs_one_loop(model):
    def loops() -> int:
        return sum(t.name == "llm-engine" and t.is_alive() for t in threading.enumerate())

    before = loops()  # other tests' engines may still run
    engine = LLMEngine(model)
    engine.start()
    try:
        engine.start()
        assert loops() == before + 1
        _, out = engine.generate(text_prompt(model), params(max_tokens=3, ignore_eos=True), timeout=10)
        assert out.completion_tokens == 3
    finally:
        engine.stop()


def test_seed_reproduces_and_different_seeds_differ(engine, model):
    p = text_prompt(model)
    a, _ = engine.generate(p, params(seed=11))
    b, _ = engine.generate(p, params(seed=11))
    c, _ = engine.generate(p, params(seed=12))
    assert a == b and a != c


def test_max_tokens_and_eos(engine, model):
    _, out = engine.generate(text_prompt(model), params(max_tokens=7, ignore_eos=True))
    assert (out.finish_reason, out.completion_tokens) == ("length", 7)


def test_stop_string_cuts_the_text_before_it(engine, model):
    p = text_prompt(model)
    full, _ = engine.generate(p, params(temperature=0, max_tokens=40, ignore_eos=True))
    stop = full[10:13]
    cut, out = engine.generate(p, params(temperature=0, max_tokens=40, ignore_eos=True, stop=(stop,)))
    assert cut == full[:full.index(stop)]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_a_repeated_token_stops_at_the_threshold(engine, model, force_token):
    force_token(model, "S")
    text, out = engine.generate(text_prompt(model), SamplingParams(max_tokens=50, seed=0))
    assert (text, out.finish_reason, out.stop_reason, out.completion_tokens) == ("SSSS", "stop", "repetition", 4)
    custom = RepetitionOptions(token_repeats=7)
    text, out = engine.generate(text_prompt(model), SamplingParams(max_tokens=50, repetition_detection=custom))
    assert (text, out.stop_reason) == ("S" * 7, "repetition")


@pytest.mark.parametrize("repetition", [RepetitionOptions(), NO_LOOP_CHECK], ids=["exempt-token", "detection-off"])
def test_exempt_tokens_and_detection_off_let_it_continue(engine, model, force_token, repetition):
    force_token(model, "-" if repetition.enabled else "S")
    text, out = engine.generate(text_prompt(model), SamplingParams(max_tokens=30, repetition_detection=repetition))
    assert out.finish_reason == "length" and out.stop_reason is None
    assert len(text) == 30


SCHEMAS = [
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer"}},
     "required": ["colour", "count"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
     "required": ["name", "ok"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                               "maxItems": 3},
                                      "box": {"type": "object", "properties": {"x": {"type": "number"},
                                                                               "y": {"type": "integer"}},
                                              "required": ["x", "y"]}},
     "required": ["tags", "box"]},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "number",
                                                                                          "minimum": 0}},
     "required": ["answer"]},
]


def test_fifty_structured_generations_from_a_random_model_all_parse_and_validate(engine, model):
    outputs, schemas = {}, {}
    for i in range(50):
        schema = SCHEMAS[i % len(SCHEMAS)]
        grammar = engine.grammars.compile({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
        outputs[i], schemas[i] = [], schema
        engine.submit(text_prompt(model, f"answer {i}"), SamplingParams(max_tokens=400, seed=i), grammar,
                      on_output=outputs[i].append)
    eventually(lambda: all(outs and outs[-1].finished for outs in outputs.values()), what="all fifty")
    for i, text in collect(outputs).items():
        assert outputs[i][-1].finish_reason == "stop", (i, text)
        jsonschema.validate(json.loads(text), schemas[i])



def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "ok": {"type": "boolean"}}, "required": ["name", "age", "ok"]}


def test_a_loop_inside_json_is_closed_so_it_still_parses(engine, model, force_token):
    force_token(model, "a")  # the model would write "aaaa..." into the name forever
    grammar = engine.grammars.compile(json_schema(PERSON))
    text, out = engine.generate(text_prompt(model), SamplingParams(max_tokens=100, seed=0), grammar)
    # Four a's fire the detector; the grammar alone then writes the shortest valid ending.
    assert (text, out.finish_reason, out.stop_reason) == ('{"name": "aaaa", "age": 0, "ok": true}', "stop",
                                                          "repetition")
    assert out.completion_tokens == len(text) + 1  # byte tokens, and the stop token
    # An ending that does not fit in max_tokens is cut, and says so.
    text, out = engine.generate(text_prompt(model), SamplingParams(max_tokens=20, seed=0), grammar)
    assert (text, out.finish_reason, out.stop_reason) == ('{"name": "aaaa", "ag', "length", "repetition")


def test_an_ending_the_grammar_cannot_find_is_capped(engine, model, force_token, monkeypatch):
    from vidserve.pipelines.llm import sequence
    monkeypatch.setattr(sequence, "CLOSING_MAX_TOKENS", 30)
    force_token(model, "a")
    # Greedy closing keeps taking "a" (the lowest id the pattern allows) and never the "b".
    grammar = engine.grammars.compile(json_schema({"type": "string", "pattern": "^a+b$"}))
    text, out = engine.generate(text_prompt(model), SamplingParams(max_tokens=400, seed=0), grammar)
    assert (text, out.finish_reason, out.stop_reason) == ('"' + "a" * 34, "length", "repetition")


def test_max_tokens_inside_json_is_length_not_stop(engine, model):
    grammar = engine.grammars.compile(json_schema(PERSON))
    text, out = engine.generate(text_prompt(model), params(max_tokens=6), grammar)
    assert (text, out.finish_reason, out.stop_reason) == ('{"name', "length", None)


CLOSING_SCHEMAS = [  # unbounded strings, so loops can happen, and each a reason to close in more than one step
    PERSON,
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                                      "box": {"type": "object", "properties": {
                                          "x": {"type": "number"}, "y": {"type": "integer", "minimum": 10}},
                                          "required": ["x", "y"]}},
     "required": ["tags", "box"]},
    {"type": "array", "items": {"type": "string", "minLength": 3}, "minItems": 2},
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "label": {"type": "string"},
                                      "ok": {"type": "boolean"}}, "required": ["label", "colour", "ok"]},
    None,  # json_object
]


@pytest.mark.parametrize("name, repetition", [
    ("vlm-tiny", RepetitionOptions(token_repeats=2, ngram_repeats=2, exempt="")),  # random text: a hair trigger
    ("vlm-shapes", RepetitionOptions()),  # the trained model collapses into loops on its own
], ids=["vlm-tiny", "vlm-shapes"])
def test_fifty_constrained_generations_with_loop_detection_stop_only_when_valid(model, name, repetition):
    chat_model = model if name == "vlm-tiny" else ChatModel.load(resolve_chat(name))
    engine = LLMEngine(chat_model)
    prompt = text_prompt(chat_model, "Make up a person.")
    outputs = {}
    for schema_index, schema in enumerate(CLOSING_SCHEMAS):
        grammar = engine.grammars.compile({"type": "json_object"} if schema is None else json_schema(schema))
        for seed in range(10):
            outputs[schema_index, seed] = []
            engine.submit(prompt, SamplingParams(max_tokens=64, seed=seed, repetition_detection=repetition),
                          grammar, on_output=outputs[schema_index, seed].append)
    engine.start()  # all fifty queued first: they decode in batches of 16
    try:
        eventually(lambda: all(outs and outs[-1].finished for outs in outputs.values()), timeout=300,
                   what="all fifty")
        texts = collect(outputs)
        for (schema_index, seed), text in texts.items():
            last = outputs[schema_index, seed][-1]
            assert last.finish_reason in ("stop", "length"), (schema_index, seed, last)
            if last.finish_reason == "stop":
                value = json.loads(text)
                schema = CLOSING_SCHEMAS[schema_index]
                jsonschema.validate(value, {"type": "object"} if schema is None else schema)
        closed = [key for key, outs in outputs.items() if (outs[-1].finish_reason, outs[-1].stop_reason)
                  == ("stop", "repetition")]
        assert len(closed) >= 10, "too few loops to test closing"
        for schema_index, seed in closed[:3]:  # a closed answer is the same alone as batched
            schema = CLOSING_SCHEMAS[schema_index]
            grammar = engine.grammars.compile({"type": "json_object"} if schema is None else json_schema(schema))
            solo, _ = engine.generate(
                prompt, SamplingParams(max_tokens=64, seed=seed, repetition_detection=repetition), grammar)
            assert solo == texts[schema_index, seed]
    finally:
        engine.stop()

def test_abort_frees_the_slot(model):
    engine = LLMEngine(model, max_running=1)
    engine.start()
    try:
        finished = threading.Event()
        long = engine.submit(text_prompt(model), params(max_tokens=2000, ignore_eos=True),
                             on_output=lambda o: o.finished and finished.set())
        eventually(lambda: long.output_ids, what="the first token")
        engine.abort(long)
        assert finished.wait(5)
        assert long.finish_reason == "abort"
        # One slot: the next request can only run because the aborted one gave it back.
        _, out = engine.generate(text_prompt(model), params(max_tokens=3, ignore_eos=True), timeout=10)
        assert out.completion_tokens == 3
    finally:
        engine.stop()


def test_limits(model):
    engine = LLMEngine(model, max_waiting=2)  # not started: everything waits
    engine.submit(text_prompt(model), params())
    engine.submit(text_prompt(model), params())
    with pytest.raises(EngineOverloaded):
        engine.submit(text_prompt(model), params())
    with pytest.raises(InvalidRequest, match="context"):
        LLMEngine(model).submit(text_prompt(model), params(max_tokens=model.max_context))


def test_a_failing_step_fails_its_sequences_not_the_engine(engine, model, monkeypatch):
    original = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("CUDA error: boom")))
    _, out = engine.generate(text_prompt(model), params(), timeout=10)
    assert out.finish_reason == "error" and "boom" in out.error
    monkeypatch.setattr(model, "forward", original)
    _, out = engine.generate(text_prompt(model), params(max_tokens=3, ignore_eos=True), timeout=10)
    assert out.finish_reason == "length"
