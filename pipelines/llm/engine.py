"""The LLM engine: continuous batching over one resident model and a paged KV cache, on its own thread.

Each step admits waiting sequences while there is room (a batch slot, and blocks of the KV
cache for their tokens: blocks.py, the cached prefix shared), encodes the next image of each
admitted prompt that still needs one (encoding.py), makes room for every decoding sequence's
next token, then runs one forward pass (batch.py) over one token of every decoding sequence
and the prompt pieces that fit this step's prefill budget (prefill.py); prompts that finish
there get their first token, the time to first token, and decode from the next step. Then the
finished ones leave, giving their blocks back. Sequences join and leave between steps, moving
no other sequence's cache, so a long answer never holds up a short one and concurrent requests
share every step; an aborted sequence leaves at the next step, whichever stage it is in.

When the pool runs out of blocks, the most recently admitted sequence gives its blocks back and
waits ahead of every request not yet admitted (which alone count towards `max_waiting`, so a
preemption never turns a new request away); readmitted, it is recomputed (its prompt and answer so far, the
cached part of them taken from the prefix cache) and goes on where it stopped, drawing from its
own seeded generator, so its answer does not change.

Callers submit from any thread and get `Output`s through a callback; the async `stream`
and blocking `generate` wrap that.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import AsyncIterator

import torch

from vidserve.errors import EngineOverloaded, InvalidRequest
from vidserve.options import RepetitionOptions

from .batch import build_step
from .blocks import BlockPool
from .encoding import ImageEncoding
from .grammar import Grammars, mask_logits
from .kv_cache import BLOCK_SIZE, KVCache, kv_budget
from .model import ChatModel
from .paged_attention import cascade_supported
from .prefill import PackedPrefill
from .prompt import Prompt
from .repetition import RepetitionDetector, exempt_token_ids
from .sampler import sample
from .sequence import Output, Piece, SamplingParams, Sequence, Status


class LLMEngine:
    def __init__(self, model: ChatModel, *, max_running: int = 16, max_waiting: int = 64,
                 prefill_tokens: int = 256, kv_tokens: int | None = None, prefix_cache: bool = True,
                 metrics=None):
        """`kv_tokens`: the KV cache's size (None: from free memory); `prefix_cache`: False
        turns automatic prefix caching off for every request."""
        self.model = model
        self.max_running, self.max_waiting = max_running, max_waiting
        self.metrics = metrics  # telemetry.ChatMetrics or None
        self.grammars = Grammars(model.tokenizer, model.vocab_size)
        shape = model.kv_shape
        self.cache = KVCache(shape, kv_budget(shape, model.device, model.max_context, max_running, kv_tokens),
                             model.device, BLOCK_SIZE)
        self.blocks = BlockPool(self.cache.num_blocks, BLOCK_SIZE, prefix_cache)
        self.cascade = cascade_supported(model.device)  # decoding reads shared prefix blocks once
        self.waiting: deque[Sequence] = deque()
        self.preempted: deque[Sequence] = deque()  # gave their blocks back; readmitted before anything waiting
        self.admitted: list[Sequence] = []  # holding blocks, in the order they were admitted
        self.encoding = ImageEncoding(model)  # admitted, needed image features not yet all computed
        self.prefill = PackedPrefill(self.blocks, prefill_tokens)  # admitted, tokens not yet all cached
        self.decoding: list[Sequence] = []
        self.decode_steps = 0  # with decoded_tokens: the mean decode batch size
        self.decoded_tokens = 0
        self.prefill_passes = 0  # steps that prefilled
        self.aborted_sequences = 0  # dropped because their caller went away
        self.preemptions = 0  # sequences that gave their blocks back to make room
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        exempt_token_ids(model.tokenizer, RepetitionOptions().exempt)  # the slow first call, at load

    # -- submitting ------------------------------------------------------------------------

    @property
    def max_sequence_tokens(self) -> int:
        """The longest sequence, prompt and answer, the engine runs: the model's context, or the
        whole KV cache if that is smaller."""
        return min(self.model.max_context, self.blocks.capacity)

    def room(self, prompt: Prompt) -> int:
        """The most tokens an answer to `prompt` could take (below 1: none)."""
        return self.max_sequence_tokens - len(prompt.token_ids)

    def check_fits(self, prompt: Prompt, max_tokens: int) -> None:
        """The context length's one check: the prompt and `max_tokens` more must fit in a sequence."""
        limit, prompt_tokens = self.max_sequence_tokens, len(prompt.token_ids)
        if prompt_tokens + max_tokens <= limit:
            return
        held = ("this model's context" if limit == self.model.max_context
                else "this server's KV cache (VIDSERVE_CHAT_KV_TOKENS)")
        room = limit - prompt_tokens
        raise InvalidRequest(
            f"the prompt is {prompt_tokens} tokens and the answer may take {max_tokens} more, but {held} holds "
            f"{limit}, prompt and answer together: shorten the messages"
            + (f" or set max_tokens to at most {room}" if room > 0 else ""),
            param="max_tokens" if room > 0 else "messages", code="context_length_exceeded")

    def submit(self, prompt: Prompt, params: SamplingParams, grammar=None, on_output=lambda _: None) -> Sequence:
        self.check_fits(prompt, params.max_tokens)
        rep = params.repetition
        detector = RepetitionDetector(rep, exempt_token_ids(self.model.tokenizer, rep.exempt)) if rep.enabled else None
        matcher = self.grammars.matcher(grammar) if grammar is not None else None
        seq = Sequence(prompt, params, self.model.tokenizer, self.model.eos_ids, device=self.model.device,
                       detector=detector, matcher=matcher, on_output=on_output)
        with self._cond:
            if len(self.waiting) >= self.max_waiting:
                raise EngineOverloaded(f"{len(self.waiting)} chat requests are already waiting; retry shortly")
            self.waiting.append(seq)
            self._cond.notify()
        return seq

    def abort(self, seq: Sequence) -> None:
        """Free the sequence's slot at the next step boundary (a client went away)."""
        seq.abort()
        with self._cond:
            self._cond.notify()

    async def stream(self, prompt: Prompt, params: SamplingParams, grammar=None) -> AsyncIterator[Output]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Output] = asyncio.Queue()
        seq = self.submit(prompt, params, grammar, lambda out: loop.call_soon_threadsafe(queue.put_nowait, out))
        try:
            while True:
                out = await queue.get()
                yield out
                if out.finished:
                    return
        finally:  # also when the consumer is cancelled or closes the stream early
            if not seq.finished:
                self.abort(seq)

    def generate(self, prompt: Prompt, params: SamplingParams, grammar=None, timeout: float | None = None
                 ) -> tuple[str, Output]:
        """Blocking: the whole text and the final output (for in-process callers)."""
        done = threading.Event()
        parts: list[str] = []
        final: list[Output] = []

        def on_output(out: Output) -> None:
            parts.append(out.text)
            if out.finished:
                final.append(out)
                done.set()

        seq = self.submit(prompt, params, grammar, on_output)
        if not done.wait(timeout):
            self.abort(seq)
            raise TimeoutError(f"generation did not finish within {timeout} s")
        return "".join(parts), final[0]

    @property
    def running(self) -> int:
        """Sequences holding a slot: decoding, or having their images encoded or prompt prefilled."""
        return len(self.admitted)

    # -- the loop --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop thread; a second call while it runs is a no-op (an app's lifespan may
        start services that were already started): two loops would step one batch at once."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._loop, name="llm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self.waiting and not self.preempted and not self.running:
                    self._cond.wait()
                if self._stopping:
                    return
            self.step()

    @torch.inference_mode()
    def step(self) -> None:
        self._drop_aborted()
        self._admit()
        self._encode_images()
        self._make_room()
        pieces = self.prefill.plan(decoding=len(self.decoding))
        try:
            if pieces or self.decoding:
                self._forward(pieces)
        except Exception as exc:  # a failed step fails its sequences, never the engine
            for seq in [p.seq for p in pieces] + self.decoding:
                if not seq.finished:
                    self._fail(seq, exc)
        self._retire()
        if self.metrics is not None:
            self.metrics.load(self.running, len(self.waiting) + len(self.preempted), self.blocks.in_use,
                              self.blocks.num_blocks)

    def _admit(self) -> None:
        while self.running < self.max_running:
            with self._cond:
                line = self.preempted or self.waiting
                if not line:
                    return
                seq = line[0]  # only this thread takes from the left
            if not self.blocks.admit(seq):
                return  # first come, first served: the head waits for blocks, and the rest behind it
            with self._cond:
                line.popleft()
            self.admitted.append(seq)
            if self.encoding.needs(seq):
                self.encoding.add(seq)
            else:
                self._to_prefill(seq, {})

    def _encode_images(self) -> None:
        encoded, failed = self.encoding.step()
        for seq, exc in failed:
            self._fail(seq, exc)
        for seq, features in encoded:
            self._to_prefill(seq, features)

    def _to_prefill(self, seq: Sequence, features: dict[int, torch.Tensor]) -> None:
        try:
            self.prefill.add(seq, features)
        except Exception as exc:  # e.g. image features that do not match the prompt's placeholders
            self._fail(seq, exc)

    def _make_room(self) -> None:
        """A block for every decoding sequence's next token, oldest first; when the pool is out,
        the most recently admitted sequence (the one needing it, at worst) gives its blocks back."""
        for seq in [s for s in self.admitted if s.status is Status.running]:
            while seq.status is Status.running and not self.blocks.append_slot(seq):
                self._preempt(self.admitted[-1])

    def _preempt(self, seq: Sequence) -> None:
        self._leave(seq)
        seq.status = Status.waiting
        self.preemptions += 1
        if self.metrics is not None:
            self.metrics.preempted()
        self.preempted.appendleft(seq)  # the oldest of them first

    def _forward(self, pieces: list[Piece]) -> None:
        decoding = list(self.decoding)
        inputs = build_step(self.model, self.cache, decoding, pieces, self.prefill.features, self.cascade)
        logits = self.model.forward(inputs_embeds=inputs.embeds, position_ids=inputs.positions, step=inputs.step,
                                    logits_at=inputs.logits_at)
        for seq in decoding:
            seq.computed += 1
        for p in pieces:
            p.seq.computed = p.stop
        for seq in decoding + [p.seq for p in pieces]:
            self.blocks.publish(seq)
        done = [p.seq for p in pieces if p.done]
        self.prefill.discard(done)
        if decoding:
            self.decode_steps += 1
            self.decoded_tokens += len(decoding)
        if pieces:
            self.prefill_passes += 1
        for seq in done:
            seq.status = Status.running
            if not seq.output_ids and self.metrics is not None:
                self.metrics.prompt_cached(seq, self.blocks.prefix_cache and seq.prefix_cache)
        self.decoding += done
        self._sample_and_append(logits, decoding + done)

    def _sample_and_append(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        mask_logits(logits, [s.matcher for s in seqs])
        tokens = sample(logits, seqs)
        for seq, token in zip(seqs, tokens):
            seq.append(token)
            if self.metrics is not None:
                self.metrics.token(seq)
            self._emit(seq)

    def _emit(self, seq: Sequence, out: Output | None = None) -> None:
        out = out or seq.take_output()
        if out is None:
            return
        try:
            seq.on_output(out)
        except Exception:  # the caller is gone (its event loop closed): free the slot
            seq.abort()
        if out.finished and self.metrics is not None:
            self.metrics.finished(seq)

    def _retire(self) -> None:
        for seq in [s for s in self.admitted if s.finished]:
            self._leave(seq)

    def _leave(self, seq: Sequence) -> None:
        """Out of every stage, its blocks given back."""
        self.encoding.discard([seq])
        self.prefill.discard([seq])
        if seq in self.decoding:
            self.decoding.remove(seq)
        if seq in self.admitted:
            self.admitted.remove(seq)
        self.blocks.release(seq)

    def _drop_aborted(self) -> None:
        with self._cond:
            aborted = [s for s in self.waiting if s.aborted]
            for seq in aborted:
                self.waiting.remove(seq)
        aborted += [s for s in self.preempted if s.aborted]
        self.preempted = deque(s for s in self.preempted if not s.aborted)
        aborted += [s for s in self.admitted if s.aborted and not s.finished]
        for seq in aborted:
            self.aborted_sequences += 1
            self._emit(seq, seq.final_output("abort"))
            self._leave(seq)

    def _fail(self, seq: Sequence, exc: Exception) -> None:
        self._emit(seq, seq.final_output("error", str(exc)))
        self._leave(seq)
