"""Any video request, one chunk or many: the entry point the CLI and the workers call.

A clip longer than the model's chunk is a chain (see `vidserve.media.drift.chain`): chunk 1
from the prompt (or the input image), chunk k+1 from the last frame of chunk k on the
model's image-to-video continuation, each measured for drift against the first chunk made
from its prompt (chunk 1, or the first after the prompt changed: a steered session, a
storyboard, a caption chain's new caption) and, with `drift_correction="color"`, corrected to
it. Progress counts steps across all chunks, and
each chunk is handed to `on_chunk` as soon as it is done, so it can be stored and streamed,
with the `ChainState` the chunks after it need: a `Resume` from it goes on where the chain
stopped, so a job whose worker was lost makes only the chunks it had not finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from PIL import Image, ImageOps

from vidserve.media.drift import Anchor, ChainState, DriftMetrics, chain
from vidserve.loras import LoraRegistry
from vidserve.options import LoadOptions
from vidserve.registry import resolve_local
from vidserve.video_request import GenerationRequest

from .loras import LoraEvent
from .video import StepCallback, VideoPipeline, get_pipeline

# (index, frames, drift, prompt, the chain's state after it): called as each chunk is done.
ChunkCallback = Callable[[int, np.ndarray, DriftMetrics, str, ChainState], None]
# Called as each chunk begins: its prompt where a steered one replaces the request's (None: the
# request's); raises drift.StopChain to end the video before it.
ChunkStart = Callable[[int], str | None]
Captioner = Callable[[Image.Image, int], str]  # (frame, seed) -> caption


@dataclass(eq=False)  # eq=False: == on the ndarray field would not give a bool
class Resume:
    """A chain stopped after its chunk `state.next_chunk - 1`, to go on from there."""

    state: ChainState
    frames: np.ndarray  # uint8 [frames, height, width, 3]: the video's frames so far, as stored


@dataclass
class ChunkReport:
    index: int
    frames: int  # frames this chunk adds to the video
    drift: dict
    prompt: str  # what this chunk was generated from


@dataclass
class VideoResult:
    frames: np.ndarray  # uint8 [frames, height, width, 3]
    fps: int
    seed: int
    timings: dict[str, float] = field(default_factory=dict)  # seconds, summed over chunks
    chunks: list[ChunkReport] = field(default_factory=list)  # the chunks this call made (a resume's are not)
    loras: list[LoraEvent] = field(default_factory=list)  # each chunk's adapters, loaded or cached
    attention: str = "dense"  # "sparse" if any chunk's self-attention ran sparse


class _ChunkGenerator:
    """Adapts the Wan pipelines to the `generate(condition, num_frames, seed, chunk)` of drift.chain."""

    def __init__(self, request: GenerationRequest, first: VideoPipeline, continuation: VideoPipeline | None,
                 on_step: StepCallback | None, load_seconds: float, caption: Captioner | None,
                 adapters: LoraRegistry | None, on_chunk_start: ChunkStart | None):
        self.request, self.first, self.continuation, self.on_step = request, first, continuation, on_step
        self.on_chunk_start = on_chunk_start
        self.caption, self.adapters = caption, adapters
        self.timings = {"load": load_seconds}
        self.prompts: dict[int, str] = {}
        self.lora_events: list[LoraEvent] = []
        self.attention = "dense"

    def generate(self, condition: np.ndarray | None, num_frames: int, seed: int, chunk: int) -> np.ndarray:
        r = self.request
        opening = chunk == 0 and not r.continuing
        pipeline = self.first if opening else self.continuation
        image = Image.fromarray(condition) if condition is not None else None
        steered = self.on_chunk_start(chunk) if self.on_chunk_start is not None else None
        prompt = steered if steered is not None else r.prompt_for(chunk)
        if r.caption_chain and not opening and self.caption is not None:
            prompt = f"{prompt} {self.caption(image, seed)}".strip()
        self.prompts[chunk] = prompt
        request = r.model_copy(update={"prompt": prompt, "num_frames": num_frames, "seed": seed, "image": image,
                                       "chunk_frames": (num_frames,)})
        steps_before, total = chunk * r.steps, r.steps * len(r.chunk_frames)

        def on_step(done: int, _: int) -> None:
            if self.on_step is not None:
                self.on_step(steps_before + done, total)

        result = pipeline.generate(request, on_step=on_step, adapters=self.adapters)
        self.lora_events += result.loras
        if result.attention != "dense":
            self.attention = result.attention
        for phase, seconds in result.timings.items():
            self.timings[phase] = self.timings.get(phase, 0.0) + seconds
        return result.frames


def generate_video(request: GenerationRequest, device: str = "auto", dtype: str = "auto",
                   on_step: StepCallback | None = None, on_chunk: ChunkCallback | None = None,
                   caption: Captioner | None = None, load: LoadOptions = LoadOptions(),
                   adapters: LoraRegistry | None = None, on_chunk_start: ChunkStart | None = None,
                   resume: Resume | None = None) -> VideoResult:
    """`caption` (the LLM path) is required when the request asks for `caption_chain`;
    `adapters`, the registered LoRAs, when it names `loras`; `on_chunk_start` steers a session;
    `resume` goes on from a chain stopped part way (the result's frames are the whole video)."""
    if request.caption_chain and caption is None:
        raise RuntimeError("caption_chain needs a chat model to caption frames, and none is configured")
    spec = resolve_local(request.model)  # the API resolved it already, or the CLI's operator named it
    start = time.perf_counter()  # ~0 once the models are resident
    first = get_pipeline(spec, device, dtype, load)
    chained = request.continuing or len(request.chunk_frames) > 1
    continuation = get_pipeline(resolve_local(spec.continues_with), device, dtype, load) if chained else None
    generator = _ChunkGenerator(request, first, continuation, on_step, time.perf_counter() - start, caption,
                                adapters, on_chunk_start)

    condition = anchor = None
    if request.image is not None:
        size = (request.width, request.height)
        condition = np.asarray(ImageOps.fit(request.image.convert("RGB"), size, Image.LANCZOS))
        # Drift is measured against chunk 1, or, when extending a video, against the frame it
        # continues from. (Not against an input image: chunk 1 may rightly move away from it.)
        anchor = Anchor.from_frames(condition[None]) if request.continuing else None
    reports: list[ChunkReport] = []
    states: list[ChainState] = []  # chain() gives the state after a chunk just before the chunk

    def chunk_done(index: int, frames: np.ndarray, metrics: DriftMetrics) -> None:
        prompt = generator.prompts[index]
        reports.append(ChunkReport(index, len(frames), metrics.to_dict(), prompt))
        if on_chunk is not None:
            on_chunk(index, frames, metrics, prompt, states[-1])

    frames, _ = chain(generator, request.chunk_frames, request.drift_correction, request.seed,
                      condition=condition, anchor=anchor, continuing=request.continuing, on_chunk=chunk_done,
                      on_state=states.append, resume=resume.state if resume is not None else None,
                      prompt_of=generator.prompts.__getitem__)
    if resume is not None:
        frames = np.concatenate([resume.frames, frames])
    return VideoResult(frames=frames, fps=request.fps, seed=request.seed, timings=generator.timings, chunks=reports,
                       loras=generator.lora_events, attention=generator.attention)
