"""Loop detection for LLM decoding: stop a sequence that has collapsed into repeating itself.

A model that starts emitting "S S S S ..." or "ab ab ab ab ..." (usually a kernel or
sampling fault, not the weights) would otherwise burn its whole token budget on
garbage. The engine calls `RepetitionDetector.check` after every token and ends the
sequence with stop_reason "repetition" when it fires; a constrained (JSON) one is first
closed by its grammar (`Sequence._close_json`), so that it still parses. Tokens made only
of characters that legitimately repeat (table rules, indentation, blank lines) are exempt.
"""

from __future__ import annotations

from typing import Any, Sequence

from vidserve.options import RepetitionOptions

# (id(tokenizer), chars) -> (tokenizer, ids). The tokenizer is kept alive in the value so
# that its id cannot be reused by another object and hit a stale entry.
_EXEMPT_CACHE: dict[tuple[int, str], tuple[Any, frozenset[int]]] = {}


def exempt_token_ids(tokenizer: Any, chars: str) -> frozenset[int]:
    """Ids of non-special tokens whose decoded text is non-empty and made only of `chars`.

    Decoding every token of a large vocabulary takes about half a second, so the result
    is computed once per tokenizer and character set.
    """
    key = (id(tokenizer), chars)
    hit = _EXEMPT_CACHE.get(key)
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    allowed, special = set(chars), set(tokenizer.all_special_ids)
    ids = frozenset(
        i for i in range(len(tokenizer))
        if i not in special and (text := tokenizer.decode([i])) and set(text) <= allowed
    )
    _EXEMPT_CACHE[key] = (tokenizer, ids)
    return ids


def _periodic_tail(tokens: Sequence[int], n: int, repeats: int) -> bool:
    """Whether tokens[-n*repeats:] is the last n tokens repeated `repeats` times."""
    if len(tokens) < n * repeats:
        return False
    # Compare backwards from the newest token: in normal text the very first comparison
    # fails, so a call costs O(ngram_max) and never depends on len(tokens).
    return all(tokens[-k] == tokens[-k - n] for k in range(1, n * (repeats - 1) + 1))


class RepetitionDetector:
    """Decides, after each generated token, whether the tail of the sequence is a loop."""

    def __init__(self, options: RepetitionOptions, exempt: frozenset[int]) -> None:
        self.options = options
        self.exempt = exempt

    def check(self, tokens: Sequence[int]) -> bool:
        """True when `tokens` (everything generated so far) ends in a collapsed loop."""
        opts = self.options
        if not opts.enabled or not tokens:
            return False
        if tokens[-1] not in self.exempt and _periodic_tail(tokens, 1, opts.token_repeats):
            return True
        for n in range(2, opts.ngram_max + 1):
            if not _periodic_tail(tokens, n, opts.ngram_repeats):
                continue
            pattern = tokens[-n:]
            # A one-token pattern ("a a") belongs to the single-token rule and its own
            # threshold; a pattern of only exempt tokens ("-|-|") is a legitimate rule line.
            if len(set(pattern)) > 1 and not all(t in self.exempt for t in pattern):
                return True
        return False
