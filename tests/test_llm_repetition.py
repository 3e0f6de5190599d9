"""Loop detection for LLM decoding: thresholds, exemptions and the exempt-token table."""

from __future__ import annotations

import random

import pytest

from vidserve.options import RepetitionOptions
from vidserve.pipelines.llm.repetition import RepetitionDetector, exempt_token_ids
from vidserve.pipelines.tiny import build_tokenizer

DASH, BAR, SPACE = 100, 101, 102
EXEMPT = frozenset({DASH, BAR, SPACE})
A, B, C, D, E, S = 1, 2, 3, 4, 5, 6


def detector(**kw) -> RepetitionDetector:
    return RepetitionDetector(RepetitionOptions(**kw), EXEMPT)


def fires_at(det: RepetitionDetector, tokens: list[int]) -> int | None:
    """Feed tokens one at a time, as the engine does; the 1-based length at which it first fires."""
    for i in range(1, len(tokens) + 1):
        if det.check(tokens[:i]):
            return i
    return None


def test_single_token_fires_exactly_at_default_threshold():
    det = detector()
    assert not det.check([A, B, S, S, S])
    assert det.check([A, B, S, S, S, S])
    assert fires_at(det, [A, B] + [S] * 10) == 6


@pytest.mark.parametrize("repeats", [2, 7])
def test_single_token_custom_threshold(repeats):
    det = detector(token_repeats=repeats)
    assert not det.check([A] + [S] * (repeats - 1))
    assert det.check([A] + [S] * repeats)


def test_single_token_threshold_not_lowered_by_pattern_rule():
    # "S S" as a 2-token pattern repeated 4 times is 8 S's; with token_repeats=10 that must not fire.
    det = detector(token_repeats=10)
    assert fires_at(det, [A] + [S] * 20) == 11


def test_exempt_token_runs_never_fire():
    det = detector()
    for tok in EXEMPT:
        assert fires_at(det, [A] + [tok] * 20) is None


@pytest.mark.parametrize("pattern", [[A, B], [A, B, C, D, E]])
def test_pattern_fires_at_ngram_repeats(pattern):
    det = detector()
    prefix = [S, E, D]
    assert not det.check(prefix + pattern * 3)
    assert det.check(prefix + pattern * 4)
    assert fires_at(det, prefix + pattern * 6) == len(prefix) + 4 * len(pattern)


def test_pattern_custom_repeats():
    det = detector(ngram_repeats=6)
    assert fires_at(det, [S] + [A, B, C] * 10) == 1 + 18


def test_all_exempt_pattern_never_fires():
    det = detector()
    assert fires_at(det, [A] + [DASH, BAR] * 20) is None
    assert fires_at(det, [A] + [DASH, DASH, SPACE] * 20) is None


def test_mixed_pattern_with_one_non_exempt_token_fires():
    det = detector()
    assert fires_at(det, [S] + [DASH, BAR, A] * 6) == 1 + 12


def test_pattern_longer_than_ngram_max_does_not_fire():
    assert fires_at(detector(ngram_max=4), list(range(1, 6)) * 10) is None
    assert fires_at(detector(ngram_max=5), list(range(1, 6)) * 10) == 20
    assert fires_at(detector(), list(range(1, 6)) * 10) == 20


def test_disabled_never_fires():
    det = detector(enabled=False)
    assert fires_at(det, [S] * 50) is None
    assert fires_at(det, [A, B] * 50) is None


def test_ngram_max_zero_keeps_single_token_rule():
    det = detector(ngram_max=0)
    assert fires_at(det, [A, B] * 50) is None
    assert fires_at(det, [A] + [S] * 10) == 5


def test_varied_text_never_fires():
    rng = random.Random(0)
    tokens = [rng.randrange(1, 5000) for _ in range(2000)]
    # Ordinary text also repeats a token or two in a row now and then.
    tokens[100:103] = [S, S, S]
    tokens[500:506] = [A, B, A, B, A, B]
    det = detector()
    assert fires_at(det, tokens) is None
    assert not det.check([])


def test_exempt_token_ids_on_byte_tokenizer():
    tok = build_tokenizer()
    chars = RepetitionOptions().exempt
    ids = exempt_token_ids(tok, chars)

    def one(text: str) -> int:
        (i,) = tok.encode(text, add_special_tokens=False)
        return i

    for text in ["-", "=", "|", " ", "\n", "0", "7"]:
        assert one(text) in ids, text
    for text in ["a", "S", "!"]:
        assert one(text) not in ids, text
    assert not ids & set(tok.all_special_ids)
    # Exactly the byte tokens for the exempt characters (all ASCII, one byte each).
    assert len(ids) == len(set(chars))
    assert exempt_token_ids(tok, chars) is ids
    # Special tokens stay out even when their text is made of the given characters.
    assert exempt_token_ids(tok, "<pad>/s") == {one(c) for c in "<pad>/s"}
    assert exempt_token_ids(tok, "-") == {one("-")}

