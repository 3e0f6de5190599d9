"""Frame rate conversion by the real ffmpeg filters: the frame count follows from the source's
count and the ratio alone, and where an output frame falls on a source frame's time it is
that frame, pixel for pixel."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vidserve.media.retime import frame_count, retime

# (source fps, target fps): up, down, whole and fractional ratios.
RATES = [(16, 32), (16, 30), (16, 24), (24, 16), (16, 8), (16, 60), (24, 25)]


def moving(count: int, size: int = 32) -> np.ndarray:
    """A square crossing a noise background: motion for the interpolation to follow."""
    background = np.random.default_rng(count).integers(0, 255, (size, size, 3), dtype=np.uint8)
    frames = np.repeat(background[None], count, axis=0)
    for i, frame in enumerate(frames):
        frame[8:16, i % (size - 8):i % (size - 8) + 8] = (255, 40, 40)
    return frames


@pytest.mark.parametrize("mode", ["interpolate", "blend"])
@pytest.mark.parametrize("source_fps, fps", RATES)
def test_counts_follow_the_ratio_and_source_frames_stay_exact(source_fps, fps, mode):
    frames = moving(17)
    converted = retime(frames, source_fps, fps, mode)
    assert len(converted) == frame_count(17, source_fps, fps) == 16 * fps // source_fps + 1
    step = fps // math.gcd(fps, source_fps)  # output frames k*step fall on source frames
    for k in range(0, len(converted), step):
        assert np.array_equal(converted[k], frames[k * source_fps // fps]), k


def test_doubling_the_rate_makes_2n_minus_1_frames_between_the_same_ends():
    frames = moving(9)
    doubled = retime(frames, 16, 32, "interpolate")
    assert len(doubled) == 2 * (9 - 1) + 1
    assert np.array_equal(doubled[0], frames[0]) and np.array_equal(doubled[-1], frames[-1])
    assert not any(np.array_equal(doubled[k], frames[k // 2]) for k in range(1, 17, 2))  # new, in-between frames


def test_the_same_rate_and_a_single_frame_pass_through():
    frames = moving(5)
    assert retime(frames, 16, 16, "interpolate") is frames
    single = frames[:1]
    assert retime(single, 16, 30, "blend") is single
