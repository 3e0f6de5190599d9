"""Ending a JSON answer early: when loop detection cuts a constrained generation, the
grammar alone writes the shortest ending it allows, so the answer still parses.

The ending is chosen greedily, one token at a time, among the tokens the grammar allows
next (`Matcher.closing_token` in grammar.py):

1. the stop token, once the JSON is complete;
2. else the longest token that spells the start of the way out: what the grammar forces
   next (xgrammar's jump-forward string: a key, `": "`, the rest of an enum value), then
   the quote of the open string, then the brackets still open, innermost first;
3. else the schema wants more (a required key, `minItems`, `minLength`, a `minimum`), and
   the shortest filler it takes: `,` before any digit, so a number is never grown digit by
   digit where a comma would do, then the shortest values (`0`, `""`, `[]`, `{}`, `null`,
   `true`);
4. else the lowest allowed id (the rest of a UTF-8 character or of an escape, a pattern).

Greedy is not always shortest, and a `pattern` can keep it going, so the caller caps it.
"""

from __future__ import annotations

import numpy as np

FILLERS = tuple(bytes([c]) for c in b',0"[{ntf123456789-')

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_CLOSER = {ord("{"): ord("}"), ord("["): ord("]")}
_CLOSERS = frozenset(_CLOSER.values())


class Nesting:
    """Where a compact JSON prefix stands: inside a string or not, and the brackets still open.

    Fed every accepted token's bytes; the grammar guarantees they are a valid JSON prefix,
    so counting quotes (minding escapes) and brackets is enough.
    """

    __slots__ = ("in_string", "escaped", "closers")

    def __init__(self) -> None:
        self.in_string = self.escaped = False
        self.closers = bytearray()  # the closing bracket of each open one, outermost first

    def feed(self, data: bytes) -> None:
        for byte in data:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif byte == _BACKSLASH:
                    self.escaped = True
                elif byte == _QUOTE:
                    self.in_string = False
            elif byte == _QUOTE:
                self.in_string = True
            elif byte in _CLOSER:
                self.closers.append(_CLOSER[byte])
            elif byte in _CLOSERS and self.closers:  # fed on every decode step: never raise there
                self.closers.pop()

    def ending_after(self, data: bytes) -> bytes:
        """`data`, then what closes the open string and brackets after it (state unchanged)."""
        after = Nesting()
        after.in_string, after.escaped, after.closers = self.in_string, self.escaped, bytearray(self.closers)
        after.feed(data)
        return data + (b'"' if after.in_string else b"") + bytes(reversed(after.closers))


def closing_token(allowed: np.ndarray, wanted: bytes, token_of: dict[bytes, int], stop_ids: list[int],
                  longest_token: int) -> int:
    """The token to take next: `allowed` is a bool per id, `wanted` the ending the nesting asks for."""
    for token in stop_ids:
        if allowed[token]:
            return token
    for length in range(min(len(wanted), longest_token), 0, -1):
        token = token_of.get(wanted[:length])
        if token is not None and allowed[token]:
            return token
    for filler in FILLERS:
        token = token_of.get(filler)
        if token is not None and allowed[token]:
            return token
    return int(np.flatnonzero(allowed)[0])
