"""Structured outputs: grammars compile from response_format, and masked decoding always ends in valid JSON.

A "random model" (seeded random logits) is the harshest user of the mask: it takes every
path the grammar leaves open, so if any path leads to invalid or endless output, it shows.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
import xgrammar as xgr

from vidserve.errors import InvalidRequest
from vidserve.pipelines.llm import grammar as grammar_mod
from vidserve.pipelines.llm.grammar import Grammars, mask_logits
from vidserve.pipelines.tiny import build_tokenizer

TOK = build_tokenizer()
VOCAB = len(TOK) + 5  # a padded lm_head: ids past the tokenizer must never be sampled
EOS = TOK.eos_token_id
NEG_INF = float("-inf")

# Bounded schemas: every string has maxLength or an enum, every array maxItems, so a
# random walk through the grammar ends quickly.
SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}, "admin": {"type": "boolean"}},
        "required": ["name", "age", "admin"]},
    "enum": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L"]}},
        "required": ["color", "size"]},
    "nested": {"type": "object", "properties": {
        "inner": {"type": "object", "properties": {"x": {"type": "integer"}, "tag": {"type": "string", "maxLength": 4}},
                  "required": ["x", "tag"]}},
        "required": ["inner"]},
    "array": {"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        "note": {"type": "string", "maxLength": 3}, "score": {"type": "number"}},
        "required": ["items"]},
}


def schema_format(schema: dict, name: str = "out") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    return Grammars(TOK, VOCAB)


@pytest.fixture(scope="module")
def byte_id() -> dict[int, int]:
    """Token id of each raw byte, as xgrammar reads the tokenizer."""
    info = xgr.TokenizerInfo.from_huggingface(TOK)
    return {b[0]: i for i, b in enumerate(info.decoded_vocab) if len(b) == 1}


def generate(grammars: Grammars, compiled, seed: int, budget: int) -> tuple[list[int], bool]:
    """Sample from random logits under the grammar until the matcher finishes or the budget is spent."""
    matcher = grammars.matcher(compiled)
    gen = torch.Generator().manual_seed(seed)
    tokens = []
    for _ in range(budget):
        logits = torch.randn(1, VOCAB, generator=gen)
        mask_logits(logits, [matcher])
        token = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen))
        assert matcher.accept(token), f"sampled token {token} was outside the mask"
        tokens.append(token)
        if matcher.finished:
            return tokens, True
    return tokens, False


def allowed(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(row.float())).flatten().tolist())


# --- compiling -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [None, {"type": "text"}])
def test_free_text_has_no_grammar(grammars, fmt):
    assert grammars.compile(fmt) is None


@pytest.mark.parametrize("fmt, param, words", [
    ({"type": "xml"}, "response_format", "'xml'"),
    ({}, "response_format", "response_format.type"),
    ("json", "response_format", "must be an object"),
    ({"type": "json_schema"}, "response_format", "json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema", "needs a 'schema'"),
    (schema_format([{"type": "string"}]), "response_format.json_schema.schema", "got list"),
    (schema_format("object"), "response_format.json_schema.schema", "got str"),
    (schema_format({"type": "string", "pattern": "("}), "response_format.json_schema.schema", "parenthesis"),
    (schema_format({"type": "integer", "minimum": 5, "maximum": 1}), "response_format.json_schema.schema", "minimum"),
    (schema_format({"$ref": "#/$defs/missing"}), "response_format.json_schema.schema", "missing"),
    (schema_format({"type": "frobnicate"}), "response_format.json_schema.schema", "frobnicate"),
])
def test_bad_formats_are_invalid_requests(grammars, fmt, param, words):
    with pytest.raises(InvalidRequest) as err:
        grammars.compile(fmt)
    assert err.value.param == param
    assert words in err.value.message
    assert ".cc:" not in err.value.message  # xgrammar's source location is noise to a user


def test_compile_cache_returns_the_same_grammar(grammars):
    fmt = schema_format(SCHEMAS["person"])
    first = grammars.compile(fmt)
    assert isinstance(first, xgr.CompiledGrammar)
    assert grammars.compile(json.loads(json.dumps(fmt))) is first
    assert grammars.compile(schema_format(SCHEMAS["person"], name="other")) is first  # the name is not the grammar
    assert grammars.compile({"type": "json_object"}) is grammars.compile({"type": "json_object"})
    assert grammars.compile(schema_format(SCHEMAS["enum"])) is not first


def test_compile_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(grammar_mod, "CACHE_SIZE", 2)
    g = Grammars(TOK, VOCAB)
    a, b, c = (schema_format({"type": "string", "maxLength": n}) for n in (1, 2, 3))
    ga = g.compile(a)
    g.compile(b)
    assert g.compile(a) is ga  # a is now the most recent...
    g.compile(c)  # ...so b is evicted, not a
    assert g.compile(a) is ga
    assert len(g._cache) == 2


# --- decoding --------------------------------------------------------------------------------


def test_random_model_always_ends_in_valid_json(grammars):
    """50 generations: 4 bounded schemas x 10 seeds, plus 10 free-form json_object ones."""
    cases = [(name, schema, seed, 400) for name, schema in SCHEMAS.items() for seed in range(10)]
    # json_object has unbounded strings: a uniform random model closes one with p ~ 1/190 per
    # byte, so a quarter of runs need more than 400 tokens; a longer budget, same guarantee.
    cases += [("json_object", None, seed, 4000) for seed in range(10)]
    assert len(cases) == 50
    for name, schema, seed, budget in cases:
        fmt = {"type": "json_object"} if schema is None else schema_format(schema, name)
        tokens, finished = generate(grammars, grammars.compile(fmt), seed, budget)
        assert finished, f"{name} seed {seed}: not finished after {budget} tokens"
        assert tokens[-1] == EOS and EOS not in tokens[:-1]
        assert max(tokens) < len(TOK)  # never a padding id
        text = TOK.decode(tokens[:-1])
        value = json.loads(text)  # raises if it does not parse
        if schema is None:
            assert isinstance(value, dict), text
        else:
            jsonschema.validate(value, schema)
        assert not any(ord(ch) < 0x20 for ch in text)  # compact: no raw newlines, tabs or control bytes


def test_mask_leaves_unconstrained_rows_alone(grammars, byte_id):
    brace = byte_id[ord("{")]
    matchers = [grammars.matcher(grammars.compile(schema_format(SCHEMAS["person"]))), None,
                grammars.matcher(grammars.compile({"type": "json_object"}))]
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0)).to(dtype)
        before = logits.clone()
        mask_logits(logits, matchers)
        assert torch.equal(logits[1], before[1])
        for row in (0, 2):
            assert allowed(logits[row]) == {brace}  # an object starts with '{' and nothing else
            assert logits[row, brace] == before[row, brace]
    # After '{"' the person schema allows only its first key; json_object any key character.
    for m in (matchers[0], matchers[2]):
        assert m.accept(brace) and m.accept(byte_id[ord('"')])
    logits = torch.zeros(3, VOCAB)
    mask_logits(logits, matchers)
    assert allowed(logits[0]) == {byte_id[ord("n")]}
    assert byte_id[ord("z")] in allowed(logits[2]) and EOS not in allowed(logits[2])
    assert torch.equal(logits[1], torch.zeros(VOCAB))


def test_no_constrained_rows_is_a_no_op(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("allocated a bitmask with no constrained rows")
    monkeypatch.setattr(xgr, "allocate_token_bitmask", boom)
    logits = torch.randn(2, VOCAB)
    before = logits.clone()
    mask_logits(logits, [None, None])
    assert torch.equal(logits, before)


def test_stop_token_only_when_complete_and_then_finished(grammars, byte_id):
    matcher = grammars.matcher(grammars.compile(schema_format({"type": "object", "properties": {
        "ok": {"type": "boolean"}}, "required": ["ok"]})))
    assert not matcher.accept(EOS)  # not before the JSON is complete
    for ch in '{"ok": tru':
        assert matcher.accept(byte_id[ord(ch)]), ch
    assert not matcher.accept(byte_id[ord("x")])  # rejected tokens change nothing
    for ch in "e}":
        assert matcher.accept(byte_id[ord(ch)])
    assert not matcher.finished  # complete, but the sequence ends only with the stop token
    logits = torch.zeros(1, VOCAB)
    mask_logits(logits, [matcher])
    assert allowed(logits[0]) == {EOS}
    assert matcher.accept(EOS) and matcher.finished
    assert not matcher.accept(byte_id[ord(" ")])
    logits = torch.zeros(2, VOCAB)
    mask_logits(logits, [matcher, None])  # a finished row is left alone
    assert torch.equal(logits, torch.zeros(2, VOCAB))


def test_junk_tokens_are_masked(grammars, byte_id):
    """Specials other than EOS, raw control bytes and UTF-8 surrogates never reach the output."""
    matcher = grammars.matcher(grammars.compile(schema_format({"type": "string", "maxLength": 5})))
    assert matcher.accept(byte_id[ord('"')])
    logits = torch.zeros(1, VOCAB)
    mask_logits(logits, [matcher])
    ok = allowed(logits[0])
    assert byte_id[ord("a")] in ok and byte_id[0xED] in ok
    assert not ok & {TOK.pad_token_id, TOK.unk_token_id, EOS}
    assert not ok & {byte_id[b] for b in range(0x20)}  # JSON forbids them raw in a string
    assert not ok & set(range(len(TOK), VOCAB))
    assert matcher.accept(byte_id[0xED])  # lead byte of U+D000..U+DFFF: only 80..9F may follow
    logits = torch.zeros(1, VOCAB)
    mask_logits(logits, [matcher])
    assert allowed(logits[0]) == {byte_id[b] for b in range(0x80, 0xA0)}


def test_logits_wider_than_the_grammar_vocab(grammars):
    matcher = grammars.matcher(grammars.compile({"type": "json_object"}))
    logits = torch.zeros(2, VOCAB + 7)
    mask_logits(logits, [matcher, None])
    assert torch.isinf(logits[0, VOCAB:]).all()
    assert torch.equal(logits[1], torch.zeros(VOCAB + 7))



# --- closing early (loop detection fired inside the JSON) ------------------------------------


def close(grammars: Grammars, fmt: dict, prefix: bytes, byte_id: dict[int, int]) -> str:
    """Accept `prefix` byte by byte, then take closing_token until the matcher finishes: the text."""
    matcher = grammars.matcher(grammars.compile(fmt))
    tokens = [byte_id[byte] for byte in prefix]
    assert all(matcher.accept(token) for token in tokens), prefix
    while not matcher.finished:
        tokens.append(matcher.closing_token())
        assert matcher.accept(tokens[-1]), f"closing_token {tokens[-1]} was outside the mask"
        assert len(tokens) < len(prefix) + 100
    assert tokens[-1] == EOS
    return TOK.decode(tokens[:-1])


@pytest.mark.parametrize("schema, prefix, closed", [
    (SCHEMAS["person"], '{"name": "ab', '{"name": "ab", "age": 0, "admin": true}'),  # required keys: shortest values
    (SCHEMAS["person"], "", '{"name": "", "age": 0, "admin": true}'),
    (None, '{"a": {"b": [1, "x', '{"a": {"b": [1, "x"]}}'),  # the string, then the brackets, innermost first
    (None, '{"a": 12', '{"a": 12}'),  # a number is closed, not grown
    (None, "{", "{}"),
    (None, '{"a": "x\\', '{"a": "x\\""}'),  # an escape is finished first
    (None, '{"a": "\xc3', None),  # half a UTF-8 character: its other half first
    ({"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 2}, '["', '[",,", ",,"]'),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 10}}, "required": ["n"]}, '{"n": ',
     '{"n": 10}'),
    # The rest of "green" is forced; of S, M and L none is shorter: the lowest id.
    (SCHEMAS["enum"], '{"color": "g', '{"color": "green", "size": "L"}'),
    ({"type": "object", "properties": {"o": {"type": "string"}, "p": {"type": "integer"}}}, "{", "{}"),
], ids=["required", "empty", "nested", "number", "object", "escape", "utf8", "min-lengths", "minimum", "enum",
        "optional"])
def test_closing_takes_the_shortest_way_out(grammars, byte_id, schema, prefix, closed):
    fmt = {"type": "json_object"} if schema is None else schema_format(schema)
    text = close(grammars, fmt, prefix.encode("latin-1" if closed is None else "utf-8"), byte_id)
    value = json.loads(text)
    if closed is None:
        assert len(value["a"]) == 1 and "\ufffd" not in text
    else:
        assert text == closed
    if schema is not None:
        jsonschema.validate(value, schema)
