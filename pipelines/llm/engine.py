"""The LLM engine: continuous batching over one resident model, on its own thread.

Each step admits waiting sequences while there is room, encodes the next image of each
admitted prompt that still has images to encode (encoding.py), runs one prefill pass over
the prompts ready for it (prefill.py: packed, and while more sequences decode than wait,
at most `prefill_tokens` of them; prompts that finish there get their first token, the
time to first token, and join the running batch), then one decode step for every running
sequence at once, then retires the finished ones. Sequences join and leave between
steps, so a long answer never holds up a short one and concurrent requests share every
decode step; an aborted sequence leaves at the next step, whichever stage it is in.
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

from .batch import RunningBatch
from .encoding import ImageEncoding
from .grammar import Grammars, mask_logits
from .model import ChatModel, Prompt
from .prefill import PackedPrefill
from .repetition import RepetitionDetector, exempt_token_ids
from .sampler import sample
from .sequence import Output, SamplingParams, Sequence, Status


class LLMEngine:
    def __init__(self, model: ChatModel, *, max_running: int = 16, max_waiting: int = 64,
                 prefill_tokens: int = 256, metrics=None):
        self.model = model
        self.max_running, self.max_waiting = max_running, max_waiting
        self.metrics = metrics  # telemetry.ChatMetrics or None
        self.grammars = Grammars(model.tokenizer, model.vocab_size)
        self.waiting: deque[Sequence] = deque()
        self.encoding = ImageEncoding(model)  # admitted, image features not yet all computed
        self.prefill = PackedPrefill(model, prefill_tokens)  # admitted, prompts not yet all cached
        self.batch = RunningBatch()
        self.decode_steps = 0  # with decoded_tokens: the mean decode batch size
        self.decoded_tokens = 0
        self.prefill_passes = 0
        self.aborted_sequences = 0  # dropped because their caller went away
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        exempt_token_ids(model.tokenizer, SamplingParams(1).repetition.exempt)  # the slow first call, at load

    # -- submitting ------------------------------------------------------------------------

    def submit(self, prompt: Prompt, params: SamplingParams, grammar=None, on_output=lambda _: None) -> Sequence:
        if len(prompt.token_ids) + params.max_tokens > self.model.max_context:
            raise InvalidRequest(
                f"this model's context is {self.model.max_context} tokens; the prompt has "
                f"{len(prompt.token_ids)} and max_tokens asks for {params.max_tokens} more", param="max_tokens",
                code="context_length_exceeded")
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
        return len(self.batch) + len(self.prefill) + len(self.encoding)

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
                while not self._stopping and not self.waiting and not self.running:
                    self._cond.wait()
                if self._stopping:
                    return
            self.step()

    @torch.inference_mode()
    def step(self) -> None:
        self._drop_aborted()
        self._admit()
        self._encode_images()
        pieces = self.prefill.plan(decoding=len(self.batch))
        try:
            if pieces:
                self._prefill(pieces)
                self._retire()
            if self.batch.seqs:
                self._decode()
                self._retire()
        except Exception as exc:  # a failed step fails its sequences, never the engine
            failed = [p.seq for p in pieces] + self.batch.seqs
            self.prefill.discard(failed)
            for seq in failed:
                if not seq.finished:
                    self._fail(seq, exc)
            self.batch = RunningBatch()
        if self.metrics is not None:
            self.metrics.load(self.running, len(self.waiting))

    def _admit(self) -> None:
        admitted: list[Sequence] = []
        with self._cond:
            while self.waiting and self.running + len(admitted) < self.max_running:
                admitted.append(self.waiting.popleft())
        for seq in admitted:
            if seq.prompt.images:
                self.encoding.add(seq)
            else:
                self._to_prefill(seq)

    def _encode_images(self) -> None:
        encoded, failed = self.encoding.step()
        for seq, exc in failed:
            self._fail(seq, exc)
        for seq, features in encoded:
            self._to_prefill(seq, features)

    def _to_prefill(self, seq: Sequence, features: list[torch.Tensor] | None = None) -> None:
        try:
            self.prefill.add(seq, features)
        except Exception as exc:  # e.g. image features that do not match the prompt's placeholders
            self._fail(seq, exc)

    def _prefill(self, pieces) -> None:
        finished, logits, caches = self.prefill.run(pieces)
        self.prefill_passes += 1
        for seq in finished:
            seq.status = Status.running
        self._sample_and_append(logits, finished)
        self.batch.join(finished, caches)

    def _decode(self) -> None:
        ids, mask, positions = self.batch.decode_inputs()
        if self.model.mrope:  # generated text continues each prompt's M-RoPE positions, the same in all 3 rows
            deltas = torch.tensor([[s.prompt.rope_delta] for s in self.batch.seqs], device=positions.device)
            positions = (positions + deltas).expand(3, -1, -1)
        logits = self.model.forward(self.batch.cache, mask, positions, input_ids=ids)
        self.decode_steps += 1
        self.decoded_tokens += len(self.batch)
        self._sample_and_append(logits, self.batch.seqs)

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
        self.batch.keep([i for i, s in enumerate(self.batch.seqs) if not s.finished])

    def _drop_aborted(self) -> None:
        with self._cond:
            aborted = [s for s in self.waiting if s.aborted]
            for seq in aborted:
                self.waiting.remove(seq)
        encoding = [s for s in self.encoding.seqs if s.aborted]
        self.encoding.discard(encoding)
        prefilling = [s for s in self.prefill.queue if s.aborted]
        self.prefill.discard(prefilling)
        for seq in aborted + encoding + prefilling + [s for s in self.batch.seqs if s.aborted and not s.finished]:
            self.aborted_sequences += 1
            seq.status = Status.finished
            seq.finish_reason = "abort"
            self._emit(seq, Output("", True, seq.prompt_len, len(seq.output_ids), "abort"))
        self._retire()

    def _fail(self, seq: Sequence, exc: Exception) -> None:
        seq.status = Status.finished
        seq.finish_reason = "error"
        self._emit(seq, Output("", True, seq.prompt_len, len(seq.output_ids), "error", error=str(exc)))
