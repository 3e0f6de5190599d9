"""The chat prefix cache between API keys: a key reuses its own prompts and images, never
another key's, so neither `usage.prompt_tokens_details.cached_tokens` nor the work before its
first token tells it whether another key sent the same prompt (a secret in a system prompt,
an image); requests that send one `cache_salt` share whatever their key, and
`VIDSERVE_CHAT_PREFIX_SHARING=global` makes one cache for all. The openai SDK against
`vidserve serve` with a keys file, against the app in process where the vision encoder's
calls are counted, and an engine stepped by hand for a burst from two keys."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from apps import app_client
from servers import Server
from test_chat_api import data_url
from test_tenancy import KEYS, as_key, keys_file

from vidserve.options import RepetitionOptions
from vidserve.pipelines.llm.engine import LLMEngine
from vidserve.pipelines.llm.model import ChatModel
from vidserve.pipelines.llm.sequence import SamplingParams
from vidserve.registry import resolve_chat

# About 450 tokens after the secret (vlm-tiny reads a character a token), as in the probe that
# found the leak; the secret comes first, so a wrong guess shares only the words before it.
BRIEF = "Greet visitors of the studio, answer questions about bookings, and keep every code private. " * 5
CACHED_TOTAL = "vidserve_chat_prompt_tokens_cached_total"


def secret_chat(code: str) -> list[dict]:
    return [{"role": "system", "content": f"The door code is {code}. {BRIEF}"},
            {"role": "user", "content": "Hello, can I come in?"}]


def image_chat(system: str) -> list[dict]:
    return [{"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": "Whose badge is this?"},
                                         {"type": "image_url", "image_url": {"url": data_url((7, 77, 177))}}]}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat-tenancy")
    server = Server(folder / "data", env={"VIDSERVE_KEYS_FILE": keys_file(folder)}).start()
    yield server
    server.stop()


def sdk(base_url: str, key: str, http_client: httpx.Client | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEYS[key], max_retries=0, http_client=http_client)


@pytest.fixture(scope="module")
def clients(server) -> dict[str, openai.OpenAI]:
    return {name: sdk(server.url, name) for name in KEYS}


def cached(client: openai.OpenAI, messages: list[dict], **extra_body) -> tuple[int, int]:
    """(cached prompt tokens, prompt tokens) of one short answer."""
    reply = client.chat.completions.create(model="vlm-tiny", max_tokens=1, messages=messages, extra_body=extra_body)
    return reply.usage.prompt_tokens_details.cached_tokens, reply.usage.prompt_tokens


def metric(server: Server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=as_key("ops")).raise_for_status().text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_a_right_guess_of_another_keys_secret_prompt_is_computed_like_a_wrong_one(server, clients):
    cached(clients["team-b"], secret_chat("000000"))  # B's cache holds the words before the secret
    for trial in range(10):
        secret = 271828 + 7919 * trial
        cached(clients["team-a"], secret_chat(f"{secret}"))
        own, prompt_tokens = cached(clients["team-a"], secret_chat(f"{secret}"))
        assert own >= 0.9 * prompt_tokens > 450  # the key's own repeat comes from its cache
        wrong, _ = cached(clients["team-b"], secret_chat(f"{secret + 1}"))
        before = metric(server, CACHED_TOTAL)
        right, _ = cached(clients["team-b"], secret_chat(f"{secret}"))
        # Only what B's own earlier prompts share with it (the first block, before the secret)
        # came cached, as for the wrong guess: B's first token waited for the rest of its
        # prompt either way, so its timing tells B nothing either.
        assert right == wrong < 32 and metric(server, CACHED_TOTAL) == before + right
    again, prompt_tokens = cached(clients["team-b"], secret_chat(f"{secret}"))
    assert again >= 0.9 * prompt_tokens  # B's own cache still works for B


def test_another_key_sending_the_same_image_computes_it(clients):
    messages = image_chat("You check visitors' badges.")
    cached(clients["team-a"], messages)
    own, prompt_tokens = cached(clients["team-a"], messages)
    assert own >= 0.9 * prompt_tokens
    assert cached(clients["team-b"], messages)[0] == 0
    assert cached(clients["ops"], messages)[0] == 0  # an admin key is a tenant like any other


def test_keys_sending_one_cache_salt_share_and_no_one_else_does(clients):
    messages = [{"role": "system", "content": f"Shared by agreement: {BRIEF}"}, {"role": "user", "content": "Hi"}]
    salt = "8q3vQ0Zk1m2fJ7wYbXn4aLr5tHc6sEd9uPgK0oIiVxM"
    cached(clients["team-a"], messages, cache_salt=salt)
    shared, prompt_tokens = cached(clients["team-b"], messages, cache_salt=salt)
    assert shared >= 0.9 * prompt_tokens
    assert cached(clients["team-b"], messages)[0] == 0  # B's own cache is not the salt's
    assert cached(clients["ops"], messages, cache_salt=salt[::-1])[0] == 0
    # A salt never names a key's own cache: B salting with A's name finds nothing of A's.
    cached(clients["team-a"], messages)
    assert cached(clients["team-b"], messages, cache_salt="team-a")[0] == 0


def test_an_empty_cache_salt_is_refused_by_name(clients):
    with pytest.raises(openai.BadRequestError) as refused:
        cached(clients["team-a"], secret_chat("0"), cache_salt="")
    assert refused.value.body["param"] == "cache_salt"


@pytest.mark.parametrize("sharing", ["key", "global"])
def test_the_vision_encoder_runs_again_for_another_key_unless_the_server_shares(tmp_path, sharing):
    with app_client(tmp_path, chat_model="vlm-tiny", keys_file=keys_file(tmp_path),
                    chat_prefix_sharing=sharing) as (http, services):
        a, b = sdk(str(http.base_url), "team-a", http), sdk(str(http.base_url), "team-b", http)
        model = services.chat.engine.model
        cached(a, image_chat("You check visitors' badges."))
        encoded = model.vision_calls
        # Another system prompt before the same picture: no prefix in common, only the picture.
        cached(b, image_chat("You are the studio's receptionist."))
        assert model.vision_calls == encoded + (sharing == "key")
        shared, prompt_tokens = cached(b, image_chat("You check visitors' badges."))
    if sharing == "global":
        assert shared >= 0.9 * prompt_tokens
    else:
        assert shared == 0


def test_a_burst_from_two_keys_shares_blocks_only_within_each_key():
    model = ChatModel.load(resolve_chat("vlm-tiny"))
    engine = LLMEngine(model)
    prompt = model.encode([{"role": "system", "content": BRIEF}, {"role": "user", "content": "Hi"}], [])
    params = {salt: SamplingParams(max_tokens=4, seed=0, ignore_eos=True, cache_salt=salt,
                                   repetition_detection=RepetitionOptions(enabled=False))
              for salt in (b"key:a", b"key:b")}
    a, b = ([engine.submit(prompt, params[salt]) for _ in range(2)] for salt in params)
    while not all(seq.output_ids for seq in a + b):
        engine.step()
    # Submitted together, each key's second prompt waited for its first one's blocks (a burst
    # computes a prefix once), and no block of one key's is in the other's tables.
    assert not {*a[0].block_table, *a[1].block_table} & {*b[0].block_table, *b[1].block_table}
    full = (len(prompt.token_ids) - 1) // 16
    assert a[1].block_table[:full] == a[0].block_table[:full] and b[1].block_table[:full] == b[0].block_table[:full]
    assert [seq.cached_tokens for seq in a + b] == [0, full * 16, 0, full * 16]
