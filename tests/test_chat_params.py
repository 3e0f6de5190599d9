"""Every sampling option of a chat request travels the whole way: request body → the engine's
`SamplingParams` → the sampler, and a new one needs only its declaration and its use.

`WALK` names each `SamplingOptions` field once. A field added without an entry here fails
`test_every_field_has_a_walk`; one dropped or renamed on the way fails the walk. The last test
makes the edit a new field takes, in a process of its own: `top_k` declared in
`vidserve/sampling.py`, used in `pipelines/llm/sampler.py`, nothing else, and a request's
`top_k` changes the answer. And the answer's bound: one context check, one message, whether the
prompt or max_tokens overflows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from apps import app_client

from vidserve.options import RepetitionOptions
from vidserve.sampling import SamplingOptions

MESSAGES = [{"role": "user", "content": "Tell me about foxes."}]

# SamplingOptions field -> (what the client sends, what the engine's SamplingParams holds).
WALK = {
    "max_tokens": (7, 7),
    "temperature": (0.5, 0.5),
    "top_p": (0.9, 0.9),
    "seed": (1234, 1234),
    "stop": (["zz", "yy"], ["zz", "yy"]),
    "repetition_detection": ({"token_repeats": 9}, RepetitionOptions(token_repeats=9)),
    "ignore_eos": (True, True),
    "prefix_cache": (False, False),
}


def test_every_field_has_a_walk():
    assert set(WALK) == set(SamplingOptions.model_fields)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with app_client(tmp_path_factory.mktemp("chat-params"), chat_model="vlm-tiny") as (client, services):
        yield client, services


@pytest.fixture
def submitted(api, monkeypatch):
    """The SamplingParams of each sequence the engine is given."""
    _, services = api
    engine, params = services.chat.engine, []
    submit = engine.submit

    def recorded(prompt, sampling, *args, **kwargs):
        params.append(sampling)
        return submit(prompt, sampling, *args, **kwargs)

    monkeypatch.setattr(engine, "submit", recorded)
    return params


def test_fields_walk_from_the_body_to_the_engine(api, submitted):
    client, _ = api
    body = {name: sent for name, (sent, _) in WALK.items()}
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES, **body})
    assert response.status_code == 200, response.text
    [params] = submitted
    for name, (_, held) in WALK.items():
        assert getattr(params, name) == held, name
    assert params.repetition == RepetitionOptions(token_repeats=9)


def test_max_completion_tokens_is_max_tokens_and_wins(api, submitted):
    client, _ = api
    for bounds, held in [({"max_completion_tokens": 5}, 5), ({"max_tokens": 9, "max_completion_tokens": 4}, 4)]:
        response = client.post("/v1/chat/completions", json={"messages": MESSAGES, **bounds})
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] <= held
    assert [p.max_tokens for p in submitted] == [5, 4]


def test_the_defaults_reach_the_engine(api, submitted):
    client, services = api
    response = client.post("/v1/chat/completions", json={"messages": MESSAGES})
    assert response.status_code == 200, response.text
    [params] = submitted
    defaults = SamplingOptions()
    for name in SamplingOptions.model_fields:
        if name != "max_tokens":  # resolved: what the context leaves, at most the server's cap
            assert getattr(params, name) == getattr(defaults, name), name
    room = services.chat.engine.max_sequence_tokens - response.json()["usage"]["prompt_tokens"]
    assert params.max_tokens == min(room, services.settings.chat_max_tokens)


def test_one_context_check_refuses_a_long_prompt_and_a_long_answer_alike(api):
    client, services = api
    engine = services.chat.engine
    limit, passes = engine.max_sequence_tokens, engine.prefill_passes
    long_prompt = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * limit}]})
    long_answer = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": limit})
    for response, param in ((long_prompt, "messages"), (long_answer, "max_tokens")):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", param)
        assert f"this model's context holds {limit}, prompt and answer together" in error["message"]
    assert "set max_tokens to at most" in long_answer.json()["error"]["message"]
    assert engine.prefill_passes == passes  # nothing reached the model


# The edit a new sampling field takes, and no other: its declaration and the sampler's use of it.
DECLARED_AFTER = '    top_p: float = Field('
DECLARATION = '    top_k: int = Field(0, ge=0, description="Sample from the k likeliest tokens (0: all).")\n'
SAMPLED_AFTER = '        probs = _top_p(probs, torch.tensor([s.params.top_p for s in seqs], device=logits.device))\n'
SAMPLING = '''        for row, seq in enumerate(seqs):
            if seq.params.top_k:
                probs[row, probs[row].argsort(descending=True)[seq.params.top_k:]] = 0
'''

NEW_FIELD = f'''
import importlib.util, json, sys
from pathlib import Path


def edited(name, anchor, addition, before):
    spec = importlib.util.find_spec(name)
    source = Path(spec.origin).read_text()
    assert source.count(anchor) == 1, f"{{name}}: the edit's anchor moved"
    source = source.replace(anchor, addition + anchor if before else anchor + addition)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, spec.origin, "exec"), module.__dict__)


edited("vidserve.sampling", {DECLARED_AFTER!r}, {DECLARATION!r}, before=True)
edited("vidserve.pipelines.llm.sampler", {SAMPLED_AFTER!r}, {SAMPLING!r}, before=False)

from apps import app_client

with app_client(Path(sys.argv[1]), chat_model="vlm-tiny") as (client, _):
    def answer(**options):
        body = {{"messages": {MESSAGES!r}, "max_tokens": 8, "ignore_eos": True, "repetition_detection": False,
                **options}}
        response = client.post("/v1/chat/completions", json=body)
        return response.json()["choices"][0]["message"]["content"] if response.status_code == 200 else response.json()

    print(json.dumps({{"greedy": answer(temperature=0),
                      "top_k": [answer(temperature=1, top_k=1, seed=seed) for seed in range(3)],
                      "sampled": [answer(temperature=1, seed=seed) for seed in range(3)],
                      "refused": answer(top_k=-1)}}))
'''


def test_a_new_field_needs_only_its_declaration_and_the_sampler(tmp_path):
    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tests), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", NEW_FIELD, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(set(got["sampled"])) > 1  # without top_k, the seeds give different answers
    assert got["top_k"] == [got["greedy"]] * 3  # with top_k 1, every seed gives the likeliest token each time
    assert got["refused"]["error"]["param"] == "top_k"
