"""Structured outputs: OpenAI-style `response_format` enforced while decoding, with xgrammar.

Asking a model nicely for JSON is not enough: a weak model, or any model at high
temperature, sometimes emits something that does not parse. Here the grammar of the
requested format decides, at every decode step, which tokens may come next; every other
logit is set to -inf before sampling, so a finished output always parses and (for
`json_schema`) validates.

How an engine uses it::

    grammars = Grammars(tokenizer, vocab_size=model.config.vocab_size)   # once per model
    compiled = grammars.compile(request.response_format)   # InvalidRequest -> 400, before queueing
    matcher = grammars.matcher(compiled) if compiled is not None else None

    each decode step, for the batch:
        mask_logits(logits, matchers)        # matchers[i] is None for unconstrained rows
        tokens = sample(logits)
        for each constrained row i:
            matchers[i].accept(tokens[i])    # False means the engine sampled outside the mask: a bug
            if matchers[i].finished:         # the JSON was complete and the stop token came
                stop row i, finish_reason "stop"; the stop token is not part of the text

The grammar only allows the tokenizer's stop token(s) once the JSON is complete, and
requires one then, so `finished` means "complete and stopped". If `max_tokens` runs out
first the output is cut short (finish_reason "length") and will not parse — as in OpenAI.
When loop detection fires inside the JSON, `Matcher.closing_token` writes the shortest
ending the grammar allows (closing.py), so a "stop" finish parses even then.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch
import xgrammar as xgr

from vidserve.errors import InvalidRequest

from .closing import Nesting, closing_token

CACHE_SIZE = 64

# Tokens no compact JSON output can ever need, cleared from every mask on top of the
# grammar's: a raw control byte (xgrammar's length-bounded strings let them through, and
# JSON forbids them unescaped; compact JSON has no raw whitespace either), and UTF-8
# surrogates (xgrammar accepts ED A0..BF; they decode to U+FFFD per byte, which breaks
# maxLength/enum on the decoded text).
_NEVER = re.compile(rb"[\x00-\x1f]|\xed[\xa0-\xbf]")

# xgrammar prefixes its errors with "[hh:mm:ss] /path/file.cc:123: "; users need only the rest.
_XGR_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


class Matcher:
    """The grammar state of one sequence: which tokens may come next, and whether it is done."""

    __slots__ = ("_matcher", "_grammars", "_after_ed", "_nesting")

    def __init__(self, grammars: Grammars, compiled: xgr.CompiledGrammar):
        self._matcher = xgr.GrammarMatcher(compiled)
        self._grammars = grammars
        self._after_ed = False  # the last token ended on a dangling 0xED lead byte
        self._nesting = Nesting()  # for closing_token: which string and brackets are open

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False (and no change) if the grammar forbids it."""
        token_id = int(token_id)
        if not self._matcher.accept_token(token_id):
            return False
        g = self._grammars
        self._after_ed = token_id in g._ends_with_ed
        if token_id not in g._stop_ids:  # a stop token's "text" is its name, not output
            self._nesting.feed(g._decoded[token_id])
        return True

    @property
    def finished(self) -> bool:
        """The output is complete and the stop token has been accepted."""
        return self._matcher.is_terminated()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` (CPU int32, one bit per token)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)
        g = self._grammars
        keep = g._keep_after_ed if self._after_ed else g._keep
        narrowed = bitmask[row] & keep
        # Our extra bans only remove junk; never leave a row with nothing to sample.
        if bool(narrowed.any()):
            bitmask[row] = narrowed

    def closing_token(self) -> int:
        """The allowed next token on the shortest way to a complete, stopped output (closing.py)."""
        g = self._grammars
        bitmask = xgr.allocate_token_bitmask(1, g.vocab_size)
        self.fill_bitmask(bitmask, 0)
        allowed = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")[:g.vocab_size].astype(bool)
        wanted = self._nesting.ending_after(self._matcher.find_jump_forward_string().encode())
        return closing_token(allowed, wanted, g._token_of, g._stop_ids, g._longest_token)


class Grammars:
    """Compiles `response_format`s for one model's tokenizer and makes matchers from them."""

    def __init__(self, tokenizer, vocab_size: int):
        # vocab_size is the logits width, which may exceed len(tokenizer) (padded lm_head);
        # xgrammar then never allows the padding ids.
        self.vocab_size = vocab_size
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        # xgrammar's own cache is unbounded; ours (below) is an LRU, so one is enough.
        self._compiler = xgr.GrammarCompiler(self.tokenizer_info, cache_enabled=False)
        self._cache: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

        stop = set(self.tokenizer_info.stop_token_ids)
        # Specials like <pad>/<unk> are not text, though xgrammar may read them as literal
        # "<pad>" inside a string; only the stop token may end the output.
        banned = set(getattr(tokenizer, "all_special_ids", ())) - stop
        after_ed = set()
        self._ends_with_ed = set()
        self._decoded = decoded = self.tokenizer_info.decoded_vocab  # token id -> bytes
        self._stop_ids = sorted(stop)
        self._token_of: dict[bytes, int] = {}  # bytes -> the first id that spells them, for closing_token
        for i in range(min(len(decoded), vocab_size)):
            b = decoded[i]
            if i in stop or not b:
                continue
            if _NEVER.search(b):
                banned.add(i)
            if i not in banned:
                self._token_of.setdefault(b, i)
            if 0xA0 <= b[0] <= 0xBF:
                after_ed.add(i)
            if b[-1] == 0xED:
                self._ends_with_ed.add(i)
        self._longest_token = max(map(len, self._token_of), default=0)
        self._keep = _keep_row(vocab_size, banned)
        self._keep_after_ed = _keep_row(vocab_size, banned | after_ed)

    def compile(self, response_format: dict | None) -> xgr.CompiledGrammar | None:
        """The grammar for a request's `response_format`, or None when output is free text."""
        key, schema = _parse(response_format)
        if key is None:
            return None
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        # Compile outside the lock: a big schema takes a while, other requests need not wait.
        # any_whitespace=False: compact JSON only. With free whitespace a weak (or random)
        # model can emit spaces and newlines forever and never close the JSON.
        try:
            if schema is None:  # json_object: any JSON object (strict_mode=False allows any keys)
                compiled = self._compiler.compile_json_schema(
                    '{"type": "object"}', any_whitespace=False, strict_mode=False)
            else:
                # strict_mode (xgrammar's default): no properties/items beyond those the
                # schema names. Such output still validates, and the model cannot pad it.
                compiled = self._compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=True)
        except (RuntimeError, ValueError) as exc:
            reason = _XGR_PREFIX.sub("", str(exc)).strip()
            raise InvalidRequest(f"response_format.json_schema.schema cannot be enforced: {reason}",
                                 param="response_format.json_schema.schema") from None
        with self._lock:
            compiled = self._cache.setdefault(key, compiled)  # a racing thread may have won
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, compiled: xgr.CompiledGrammar) -> Matcher:
        """A fresh matcher for one sequence (compiled grammars are shared, matchers are not)."""
        return Matcher(self, compiled)


def mask_logits(logits: torch.Tensor, matchers: Sequence[Matcher | None]) -> None:
    """Set the logits of tokens the grammar forbids to -inf, in place, row by row.

    Rows whose matcher is None (unconstrained) or finished are left alone; when no row is
    constrained nothing is allocated or copied.
    """
    rows = [i for i, m in enumerate(matchers) if m is not None and not m.finished]
    if not rows:
        return
    if logits.dim() != 2 or logits.shape[0] != len(matchers):
        raise ValueError(f"logits {tuple(logits.shape)} do not match {len(matchers)} matchers")
    vocab = {matchers[i]._grammars.vocab_size for i in rows}
    if len(vocab) != 1:
        raise ValueError("matchers in one batch must come from the same model's Grammars")
    vocab_size = vocab.pop()
    # A fresh bitmask per step: ceil(V/32) int32 per row is a few KiB, far cheaper than the
    # grammar work that fills it, and a shared buffer would race between engine threads.
    bitmask = xgr.allocate_token_bitmask(logits.shape[0], vocab_size)
    for i in rows:
        matchers[i].fill_bitmask(bitmask, i)
    width = logits.shape[-1]
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=min(width, vocab_size),
                                    indices=rows)
    if width > vocab_size:  # logits wider than the grammar knows: those ids are never valid
        logits[rows, vocab_size:] = float("-inf")


def _parse(response_format) -> tuple[str | None, dict | None]:
    """Check a response_format; return (cache key, schema), (None, None) for free text."""
    if response_format is None:
        return None, None
    if not isinstance(response_format, dict):
        raise InvalidRequest("response_format must be an object such as {\"type\": \"json_object\"}",
                             param="response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None, None
    if kind == "json_object":
        return "json_object", None
    if kind != "json_schema":
        raise InvalidRequest(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                             param="response_format")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequest("response_format of type 'json_schema' needs a 'json_schema' object: "
                             "{\"name\": ..., \"schema\": {...}}", param="response_format")
    if "schema" not in spec:
        raise InvalidRequest("response_format.json_schema needs a 'schema' (a JSON Schema object)",
                             param="response_format.json_schema.schema")
    schema = spec["schema"]
    if not isinstance(schema, dict):
        raise InvalidRequest(f"response_format.json_schema.schema must be a JSON Schema object, "
                             f"got {type(schema).__name__}", param="response_format.json_schema.schema")
    try:
        # The grammar depends on the schema alone (not name/strict). Not sort_keys: the
        # grammar emits properties in the schema's declared order, so order is part of it.
        canonical = json.dumps(schema, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"response_format.json_schema.schema is not JSON: {exc}",
                             param="response_format.json_schema.schema") from None
    return "json_schema:" + canonical, schema


def _keep_row(vocab_size: int, banned: set[int]) -> torch.Tensor:
    """A bitmask row (int32, bit j%32 of word j//32, LSB first — xgrammar's layout) with `banned` cleared."""
    words = (vocab_size + 31) // 32
    bits = np.ones(words * 32, dtype=bool)
    bits[[i for i in banned if i < vocab_size]] = False
    packed = np.packbits(bits.reshape(words, 32), axis=1, bitorder="little")
    return torch.from_numpy(packed.view("<i4").reshape(words).copy())
