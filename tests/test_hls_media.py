"""The parts under live video: a chunk as a CMAF segment moved to its place in the video,
segments joined into one MP4, the HLS playlist; and the job's steering (prompt updates, stop)
as the runner and the chain read it."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from drift_doubles import SyntheticDriftGenerator

from vidserve import jobs
from vidserve.jobs import InvalidTransition, Job
from vidserve.media import ffmpeg_exe, read_video
from vidserve.media.drift import StopChain, chain
from vidserve.media.hls import Timeline, encode_segment, media_playlist, target_seconds
from vidserve.params import JobParams


def moving(count: int, start: int) -> np.ndarray:
    """A bright bar that moves one column per frame, numbered from `start`."""
    frames = np.full((count, 32, 48, 3), 40, np.uint8)
    for i in range(count):
        frames[i, :, (start + i) % 48] = 230
    return frames


def decoded(data: bytes, tmp_path) -> np.ndarray:
    path = tmp_path / "stream.mp4"
    path.write_bytes(data)
    run = subprocess.run([ffmpeg_exe(), "-hide_banner", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                         capture_output=True, check=True)
    return np.frombuffer(run.stdout, np.uint8).reshape(-1, 32, 48, 3)


@pytest.fixture(scope="module")
def segments():
    return [encode_segment(moving(9, 0), 8), encode_segment(moving(8, 9), 8), encode_segment(moving(8, 17), 8)]


def test_every_chunk_has_the_same_init_segment(segments):
    assert len({s.init for s in segments}) == 1
    assert [s.frames for s in segments] == [9, 8, 8] and segments[0].seconds == 9 / 8


def test_segments_moved_to_their_place_play_as_one_timeline(segments, tmp_path):
    placed = segments[0].at(0) + segments[1].at(9) + segments[2].at(17)
    frames = decoded(segments[0].init + placed, tmp_path)
    assert len(frames) == 25
    # Frame k shows the bar in column k: nothing dropped, repeated or out of order.
    assert [int(np.argmax(f[16, :, 0])) for f in frames] == list(range(25))
    # Left where each encode put them (every chunk from 0), they overlap, and frames are lost.
    unplaced = segments[0].media + segments[1].media + segments[2].media
    assert len(decoded(segments[0].init + unplaced, tmp_path)) < 25


def test_a_timeline_places_each_segment_and_joins_them_into_the_same_encoded_frames(segments, tmp_path):
    timeline = Timeline()
    placed = [timeline.add(segment) for segment in segments]
    assert placed == [segments[0].at(0), segments[1].at(9), segments[2].at(17)] and timeline.frames == 25
    video = timeline.join(tmp_path / "video.mp4")
    joined, fps = read_video(video)
    assert fps == 8 and np.array_equal(joined, decoded(segments[0].init + b"".join(placed), tmp_path))
    assert video.read_bytes()[4:8] == b"ftyp" and b"moof" not in video.read_bytes()  # an ordinary MP4


def test_the_playlist_grows_then_ends():
    empty = media_playlist("stream/init.mp4", [], target_seconds(2.06), ended=False)
    assert "#EXT-X-MAP" not in empty and "#EXT-X-TARGETDURATION:3" in empty and "#EXT-X-ENDLIST" not in empty
    growing = media_playlist("stream/init.mp4?token=t", [("stream/0.m4s?token=t", 2.0625)], 3, ended=False)
    assert growing.splitlines()[:7] == ["#EXTM3U", "#EXT-X-VERSION:7", "#EXT-X-TARGETDURATION:3",
                                        "#EXT-X-MEDIA-SEQUENCE:0", "#EXT-X-PLAYLIST-TYPE:EVENT",
                                        "#EXT-X-INDEPENDENT-SEGMENTS", '#EXT-X-MAP:URI="stream/init.mp4?token=t"']
    assert growing.splitlines()[7:] == ["#EXTINF:2.062,", "stream/0.m4s?token=t"]
    ended = media_playlist("stream/init.mp4", [("stream/0.m4s", 2.0)], 3, ended=True)
    assert ended.endswith("#EXT-X-ENDLIST\n")


def running_job() -> Job:
    params = JobParams(width=64, height=64, num_frames=49, fps=16, chunk_frames=(17, 17, 17), steps=1, guidance=1.0,
                       seed=0, seconds="3")
    job = Job(model="wan-tiny", prompt="first", params=params)
    jobs.start("w", 30)(job)
    return job


def test_a_prompt_update_applies_from_the_chunk_after_the_one_under_way():
    job = running_job()
    jobs.update_prompt("before any chunk")(job)
    jobs.chunk_started("w", 0)(job)
    jobs.update_prompt("second")(job)
    jobs.chunk_started("w", 1)(job)
    jobs.update_prompt("third")(job)
    assert [u.from_chunk for u in job.prompt_updates] == [0, 1, 2]
    assert [jobs.steered_prompt(job, i) for i in range(3)] == ["before any chunk", "second", "third"]


def test_stop_ends_after_the_chunk_under_way_and_refuses_later_updates():
    job = running_job()
    jobs.request_stop(job)
    assert job.stop_after_chunks == 1  # not begun yet: the first chunk is still made
    job = running_job()
    jobs.chunk_started("w", 0)(job)
    jobs.chunk_started("w", 1)(job)
    jobs.request_stop(job)
    assert job.stop_after_chunks == 2
    with pytest.raises(InvalidTransition):
        jobs.update_prompt("too late")(job)


class _Stopping(SyntheticDriftGenerator):
    def __init__(self, stop_at: int):
        super().__init__()
        self.stop_at = stop_at

    def generate(self, condition, num_frames, seed, chunk):
        if chunk == self.stop_at:
            raise StopChain()
        return super().generate(condition, num_frames, seed, chunk)


def test_a_stopped_chain_ends_with_the_chunks_made():
    seen = []
    frames, metrics = chain(_Stopping(2), [5, 5, 5, 5], on_chunk=lambda i, f, m: seen.append(i))
    assert seen == [0, 1] and len(metrics) == 2 and len(frames) == 5 + 4
    with pytest.raises(StopChain):  # a video has at least one chunk
        chain(_Stopping(0), [5, 5])
