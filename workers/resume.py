"""Where a job run again after its worker was lost goes on: after its last finished chunk.

Each chunk's files and the chain's state after it (`ChainState`: the frame the next chunk starts
from, the drift reference) are stored before the chunk is recorded on the job, so a rerun keeps
the recorded chunks and their segments (its stream only grows) and makes only the rest. Where a
state cannot be read back, it goes on from the newest chunk whose state can, or from the start,
making the chunks after it again in their places.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

import numpy as np

from vidserve.jobs import ChunkRecord, Job, SegmentRecord
from vidserve.jobs.files import JobFiles
from vidserve.media import read_video_bytes
from vidserve.media.drift import ChainState
from vidserve.media.hls import Timeline

if TYPE_CHECKING:
    from vidserve.pipelines.chain import Resume

log = logging.getLogger("vidserve.runner")

def resume_point(job: Job, chunks_planned: int, read: Callable[[str], bytes]) -> tuple[Resume | None, Timeline]:
    """Where this run goes on (None: from the start) and the timeline of the segments it keeps:
    after the newest recorded chunk whose state, and the files of every chunk up to it, read
    back with `read` (a chunk is recorded only once they are stored, so nearly always the last one)."""
    chunks = {chunk.index: chunk for chunk in job.chunks}
    segments = {segment.chunk: segment for segment in job.segments}  # the source's under None
    if job.source_video_key is not None and None not in segments:
        return None, Timeline()
    recorded = 0  # chunks 0 .. recorded - 1 are all recorded, each with its segment
    while recorded < chunks_planned and recorded in chunks and recorded in segments:
        recorded += 1
    for next_chunk in range(recorded, 0, -1):
        try:
            resume, timeline = _resume_at(job, next_chunk, chunks, segments, read)
        except (FileNotFoundError, ValueError) as exc:
            log.warning("job %s: cannot go on after chunk %d (%s)", job.id, next_chunk - 1, exc)
            continue
        log.info("job %s, attempt %d: goes on from chunk %d of %d, keeping the %d made", job.id, job.attempts,
                 next_chunk, chunks_planned, next_chunk)
        return resume, timeline
    if recorded:
        log.warning("job %s, attempt %d: starts over, making its %d recorded chunks again in their places",
                    job.id, job.attempts, recorded)
    return None, Timeline()


def _resume_at(job: Job, next_chunk: int, chunks: dict[int, ChunkRecord], segments: dict[int | None, SegmentRecord],
               read: Callable[[str], bytes]) -> tuple[Resume, Timeline]:
    """A resume from chunk `next_chunk`, read back from storage: FileNotFoundError or
    ValueError where something it needs is missing or unreadable."""
    from vidserve.pipelines.chain import Resume  # torch stays out of processes that never run jobs

    state = ChainState.from_bytes(read(JobFiles(job.id).chain_state(next_chunk - 1)))
    if state.next_chunk != next_chunk:
        raise ValueError(f"the state stored after chunk {next_chunk - 1} goes on from chunk {state.next_chunk}")
    if job.stream_init_key is None:
        raise ValueError("no init segment is recorded")
    timeline = Timeline()
    init = read(job.stream_init_key)
    kept = ([None] if job.source_video_key is not None else []) + list(range(next_chunk))
    for chunk in kept:
        timeline.add_placed(init, read(segments[chunk].key), segments[chunk].frames)
    # The frames made so far, for the outputs made from the whole video (thumbnail, renditions):
    # decoded from the chunks' MP4s, the frames the stream plays.
    made = []
    for index in range(next_chunk):
        data = read(chunks[index].key)
        try:
            frames = read_video_bytes(data)[0]
        except Exception as exc:  # whatever ffmpeg makes of a damaged file
            raise ValueError(f"chunk {index}'s MP4 does not decode: {type(exc).__name__}: {exc}") from exc
        if len(frames) != chunks[index].frames or frames.shape[1:] != state.condition.shape:
            raise ValueError(f"chunk {index}'s MP4 holds {frames.shape}, not {chunks[index].frames} frames "
                             f"of {state.condition.shape}")
        made.append(frames)
    return Resume(state, np.concatenate(made)), timeline
