"""One request's life in the engine: its prompt, sampling parameters, generated tokens,
text so far, its blocks of the KV cache, and why it stopped; and a `Piece` of it, the tokens
one engine step computes."""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable

import torch
from pydantic import ConfigDict, Field

from vidserve.sampling import SamplingOptions

from .prompt import Prompt

_ids = itertools.count()

# The most tokens the grammar may add to close a constrained answer that loop detection cut
# (`Sequence._close_json`): enough for a handful of required keys spelled byte by byte.
CLOSING_MAX_TOKENS = 256


class SamplingParams(SamplingOptions):
    """A sequence's sampling options as the engine runs them: the request's `SamplingOptions`,
    its answer's bound resolved, and whose prefix cache it uses."""

    model_config = ConfigDict(frozen=True)

    max_tokens: int = Field(ge=1)
    # Whose cache: cached prefix blocks and image features are shared only between sequences
    # with the same salt (service.py derives it from the API key or the request's cache_salt).
    cache_salt: bytes = b""

    @classmethod
    def of(cls, options: SamplingOptions, *, max_tokens: int, cache_salt: bytes) -> SamplingParams:
        """Every option the request declares, whatever it is (the request body extends them)."""
        asked = {name: getattr(options, name) for name in SamplingOptions.model_fields}
        return cls(**{**asked, "max_tokens": max_tokens, "cache_salt": cache_salt})


@dataclass(frozen=True)
class Output:
    """What the caller gets after each step that produced text, and once at the end."""

    text: str  # new text since the last output
    finished: bool
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None  # stop | length | abort | error
    # The stop string matched, or "repetition" (with "length" too when a constrained answer
    # cut by loop detection could not be closed in time).
    stop_reason: str | None = None
    error: str | None = None  # set with finish_reason "error": the engine failed this sequence
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


@dataclass(frozen=True)
class Piece:
    """Tokens [start, stop) of a sequence, computed in one engine step. Once batch.py has laid
    out the step's row: `at`, the column of its first token there, and for a prompt piece with a
    past, the `blocks` it reads (with `mask` [length, stop]: its past and itself, nothing after)."""

    seq: Sequence
    start: int
    stop: int
    at: int = 0
    blocks: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.stop - self.start

    @property
    def done(self) -> bool:
        """Its last token is the sequence's last: its logits give the next token."""
        return self.stop == self.seq.num_tokens


class Status(Enum):
    waiting = "waiting"
    running = "running"
    finished = "finished"


class Sequence:
    def __init__(self, prompt: Prompt, params: SamplingParams, tokenizer, eos_ids: frozenset[int], *,
                 device: torch.device | str = "cpu", detector=None, matcher=None,
                 on_output: Callable[[Output], None] = lambda _: None):
        self.id = next(_ids)
        self.prompt = prompt
        self.params = params
        self.tokenizer = tokenizer
        self.eos_ids = frozenset() if params.ignore_eos else eos_ids
        self.detector = detector  # RepetitionDetector or None
        self.matcher = matcher  # grammar Matcher or None
        self.on_output = on_output
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator(device=device).manual_seed(seed)  # on the logits' device
        self.status = Status.waiting
        self.prefix_cache = params.prefix_cache
        # The KV cache (blocks.py): the blocks of its tokens in order, how many tokens they hold
        # computed, how many of those are offered to other sequences, the prefix keys of its full
        # blocks so far, and how many prompt tokens came from the cache when it was first admitted.
        self.block_table: list[int] = []
        self.computed = self.published = 0
        self.block_keys: list[bytes] = []
        self.cached_tokens = 0
        self.output_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self.aborted = False
        self.arrival = time.perf_counter()
        self.first_token_at: float | None = None  # perf_counter times, for latency metrics
        self.previous_token_at: float | None = None
        self.last_token_at: float | None = None
        self._text = ""
        self._emitted = 0  # chars of _text already handed out
        self._prefix_offset = self._read_offset = 0  # incremental detokenization window

    @property
    def prompt_len(self) -> int:
        return len(self.prompt.token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt and generated tokens."""
        return len(self.prompt.token_ids) + len(self.output_ids)

    def token_ids(self, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) of the prompt and answer together."""
        prompt = self.prompt.token_ids
        if stop <= len(prompt):
            return prompt[start:stop]
        return prompt[start:] + self.output_ids[max(start - len(prompt), 0):stop - len(prompt)]

    @property
    def finished(self) -> bool:
        return self.status is Status.finished

    def append(self, token: int) -> None:
        """Take one sampled token and decide whether the sequence is done."""
        self.previous_token_at, self.last_token_at = self.last_token_at, time.perf_counter()
        self.first_token_at = self.first_token_at or self.last_token_at
        self.output_ids.append(token)
        if token in self.eos_ids:
            return self._finish("stop")
        if self.matcher is not None and not self.matcher.accept(token):
            return self._finish("stop", "grammar")  # unreachable while the mask is applied; never loop on it
        self._detokenize()
        if self.matcher is not None and self.matcher.finished:
            return self._finish("stop")
        if self._hit_stop_string():
            return
        if self.detector is not None and self.detector.check(self.output_ids):
            if self.matcher is not None:
                return self._close_json()
            return self._finish("stop", "repetition")
        if len(self.output_ids) >= self.params.max_tokens:
            return self._finish("length")

    def _close_json(self) -> None:
        """Loop detection fired inside a constrained answer: rather than cut the JSON where it
        stands, end it the shortest way the grammar allows, so that `stop` still means it
        parses and validates. The grammar picks the tokens (`Matcher.closing_token`), not
        the model, so the loop cannot come back and the detector is not asked again. An
        ending that does not fit in CLOSING_MAX_TOKENS or max_tokens is cut: `length`."""
        for _ in range(min(CLOSING_MAX_TOKENS, self.params.max_tokens - len(self.output_ids))):
            token = self.matcher.closing_token()
            self.output_ids.append(token)
            self.matcher.accept(token)
            if self.matcher.finished:  # the stop token: no text
                return self._finish("stop", "repetition")
            self._detokenize()
            if self._hit_stop_string():
                return
        self._finish("length", "repetition")

    def abort(self) -> None:
        self.aborted = True

    def _finish(self, reason: str, stop_reason: str | None = None) -> None:
        if stop_reason is None or stop_reason not in self.params.stop:
            self._detokenize(final=True)  # flush a held-back partial character
        self.status = Status.finished
        self.finish_reason, self.stop_reason = reason, stop_reason

    def _detokenize(self, final: bool = False) -> None:
        # Decode a short window: a token may be half of a UTF-8 character, and some
        # tokenizers decode a token differently after a neighbour (leading spaces).
        ids = self.output_ids
        before = self.tokenizer.decode(ids[self._prefix_offset:self._read_offset], skip_special_tokens=True)
        after = self.tokenizer.decode(ids[self._prefix_offset:], skip_special_tokens=True)
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            self._text += after[len(before):]
            self._prefix_offset, self._read_offset = self._read_offset, len(ids)

    def _hit_stop_string(self) -> bool:
        longest = max((len(s) for s in self.params.stop), default=0)
        window_start = max(0, self._emitted - longest)
        for stop in self.params.stop:
            at = self._text.find(stop, window_start)
            if at != -1:
                self._text = self._text[:at]
                self._finish("stop", stop)
                return True
        return False

    def take_output(self) -> Output | None:
        """New text (held back while it could still be the start of a stop string)."""
        end = len(self._text)
        if not self.finished and self.params.stop:
            end -= max(len(s) for s in self.params.stop) - 1
        delta = self._text[self._emitted:max(end, self._emitted)]
        if not delta and not self.finished:
            return None
        self._emitted += len(delta)
        return Output(delta, self.finished, self.prompt_len, len(self.output_ids), self.finish_reason, self.stop_reason,
                      cached_tokens=self.cached_tokens)

    def final_output(self, reason: str, error: str | None = None) -> Output:
        """The last output of a sequence the engine ends itself (aborted, failed)."""
        self.status = Status.finished
        self.finish_reason = reason
        return Output("", True, self.prompt_len, len(self.output_ids), reason, error=error,
                      cached_tokens=self.cached_tokens)
