"""A running video's files, stored as they are made, and recorded on its job.

Each chunk is encoded once, as a CMAF segment (`media/hls.py`): stored as the stream's next
segment (the init segment with the first) and, joined, as the chunk's own MP4, then recorded
(`jobs.chunk_done`) after the chain's state for the next chunk, so a rerun after a lost worker
goes on from it (`workers/resume.py`). At the end the stream's segments, joined, are the video
(unless its one chunk already is), beside the thumbnail, the spritesheet and each rendition the
job asks for. Every store and storage call goes through `JobIO`: an outage is waited out.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from vidserve import jobs
from vidserve.config import Settings
from vidserve.jobs import ChunkDrift, ChunkRecord, Job, SegmentRecord
from vidserve.jobs.files import JobFiles
from vidserve.media import save_thumbnail
from vidserve.media.drift import ChainState, DriftMetrics
from vidserve.media.hls import Segment, Timeline, encode_segment, join_segments
from vidserve.media.quality import chunk_warnings
from vidserve.media.renderer import Provenance, Renderer
from vidserve.media.spritesheet import save_spritesheet
from vidserve.storage import StorageUnavailable
from vidserve.telemetry import Metrics
from vidserve.video_request import GenerationRequest
from vidserve.webhooks import WebhookSender, announce_chunk

from .job_io import JobIO

log = logging.getLogger("vidserve.runner")


@dataclass
class VideoPublisher:
    """Stores and records the files of `job`, one run of it, as the worker `worker_id` makes them."""

    job: Job
    fps: int
    timeline: Timeline  # the stream's segments so far: none, or those a rerun keeps
    one_chunk: bool  # the video is its one chunk (and no source): stored once, as the video
    io: JobIO
    worker_id: str
    metrics: Metrics
    settings: Settings
    webhooks: WebhookSender | None

    @property
    def files(self) -> JobFiles:
        return JobFiles(self.job.id)

    def publish_source(self, frames: np.ndarray) -> None:
        """The video an extension continues, as its stream's first segment."""
        record, init_key = self._put_segment(None, encode_segment(frames, self.fps))
        self.io.write(self.job.id, jobs.segment_done(self.worker_id, record, init_key))

    def publish_chunk(self, index: int, frames: np.ndarray, drift: DriftMetrics, prompt: str,
                      state: ChainState | None = None) -> None:
        """Chunk `index`, as it finishes (`generate_video`'s `on_chunk`): its MP4 (the video's, when it is the
        video's one chunk) and the stream's next segment, from one encode; then the chain's `state` after it;
        then its record, with its warnings, so a blank or frozen chunk is flagged while the video goes on."""
        segment = encode_segment(frames, self.fps)
        key = self.files.video if self.one_chunk else self.files.chunk_video(index)
        with tempfile.TemporaryDirectory(prefix=f"{self.job.id}-") as tmp:
            self.io.put_file(key, join_segments(segment.init, [segment.media], Path(tmp) / "chunk.mp4"))
        record, init_key = self._put_segment(index, segment)
        if state is not None:
            self.io.put_bytes(self.files.chain_state(index), state.to_bytes())
        chunk = ChunkRecord(index=index, frames=len(frames), key=key, drift=ChunkDrift(**drift.to_dict()),
                            prompt=prompt)
        current = self.io.write(self.job.id, jobs.chunk_done(self.worker_id, chunk, record, init_key,
                                                             chunk_warnings(frames, index)))
        announce_chunk(self.webhooks, self.settings, current, index)

    def _put_segment(self, chunk: int | None, segment: Segment) -> tuple[SegmentRecord, str]:
        """Store `segment` as the stream's next, chunk `chunk`'s (None: the source's), and the init
        segment with the first: (its record, the init segment's key)."""
        init_key = self.files.stream_init
        if not self.timeline.media:
            self.io.put_bytes(init_key, segment.init)
        key = self.files.segment(chunk)
        self.io.put_bytes(key, self.timeline.add(segment))
        if len(self.timeline.media) == 1:
            self.metrics.first_segment.labels(self.job.model).observe(time.time() - self.job.created_at)
        return SegmentRecord(chunk=chunk, key=key, frames=segment.frames, seconds=segment.seconds), init_key

    def store_outputs(self, frames: np.ndarray) -> dict[str, str]:
        """The video (its stream's segments joined, unless its one chunk already is it), the
        thumbnail and the spritesheet: their storage keys by name."""
        with tempfile.TemporaryDirectory(prefix=f"{self.job.id}-") as tmp:
            if not self.one_chunk:
                self.io.put_file(self.files.video, self.timeline.join(Path(tmp) / "video.mp4"))
            thumb = save_thumbnail(frames, Path(tmp) / "thumbnail.webp")
            sprites = save_spritesheet(frames, Path(tmp) / "spritesheet.jpg")
            return {"video": self.files.video, "thumbnail": self.io.put_file(self.files.thumbnail, thumb),
                    "spritesheet": self.io.put_file(self.files.spritesheet, sprites)}

    def store_renditions(self, request: GenerationRequest, frames: np.ndarray, timings: dict[str, float],
                         on_stored: Callable[[int, int], None]) -> tuple[dict[str, str], dict[str, int]]:
        """Each rendition the job asks for, encoded, stored and timed (`encode.NAME` in `timings`)
        in turn: (their storage keys, their sizes). `on_stored(done, total)` after each: progress,
        and a cancel between two."""
        keys: dict[str, str] = {}
        sizes: dict[str, int] = {}
        renderer = Renderer(frames, request.fps, Provenance(request.prompt, self.job.model, request.seed))
        # Renditions at one rate one after another: each frame rate conversion is made once
        # (and counts toward the first rendition's time).
        ordered = sorted(self.job.params.outputs, key=lambda r: (r.fps_mode or "", r.fps))
        with tempfile.TemporaryDirectory(prefix=f"{self.job.id}-") as tmp:
            for done, rendition in enumerate(ordered, 1):
                start = time.perf_counter()
                path = renderer.write(rendition, Path(tmp) / rendition.filename)
                sizes[rendition.name] = path.stat().st_size
                keys[rendition.name] = self.io.put_file(self.files.rendition(rendition.filename), path)
                timings[f"encode.{rendition.name}"] = time.perf_counter() - start
                on_stored(done, len(ordered))
        return keys, sizes

    def forget_chain_states(self) -> None:
        """A completed job is never run again: its chain states go (a failure here leaves them to
        the job's deletion)."""
        try:
            self.io.delete_prefix(self.files.chain_states)
        except StorageUnavailable as exc:
            log.warning("job %s: its chain states stay until it is deleted: %s", self.job.id, exc)
