"""Output checks: a clip that is blank, one flat colour, or frozen carries a warning, so a
failed generation is not passed off as a normal video. Each chunk of a video is checked as it
is made, and the whole video once it is finished. Pure numpy, on the frames before encoding.

The thresholds come from the trained `wan-shapes` model's normal clips (its default 20 steps,
8 prompts x 3 seeds: moving, bouncing and still shapes on black, white and gray) and from
the tiny random models' noise frames. In its most nearly blank frame, the darkest normal clip
still had 6.6% of its pixels off near-black and the palest 4.9% off near-white; the flattest
had 5.2% off its one colour; the stillest ("a green circle standing still") changed by 1.7/255
from its first frame. Each limit below sits 3 to 13 times inside those. With too few steps
(4-12) some clips never draw the shape at all, and are rightly called blank.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, Field

# Luma at or below NEAR_BLACK, or at or above NEAR_WHITE, reads as black or white.
NEAR_BLACK = 24.0
NEAR_WHITE = 231.0
# A pixel within FLAT_TOLERANCE levels of a colour, on every channel, is that colour.
FLAT_TOLERANCE = 12
# The share of a frame's pixels that may stray (a codec speckle, a stray VAE pixel) before
# the frame counts as showing something: a 4x4-pixel dot in a 64x64 frame is 0.4%.
STRAY_SHARE = 0.005
# The most a frame may differ from the first, in mean absolute luma, for the clip to be frozen.
FROZEN_CHANGE = 0.5
# At most this many frames, evenly spaced, and pixels on a grid at most this wide and high are
# looked at, so a long 720p clip costs about what a short small one does.
MAX_FRAMES = 64
MAX_SIDE = 256

TRY_AGAIN = "try another seed or prompt"


class OutputWarning(BaseModel):
    code: str  # blank_output, constant_output, frozen_output; at submission untrained_size, prompt_not_understood
    message: str
    chunk: int | None = Field(None, description="The chunk it was found in (its `chunks[].index`); null: the whole "
                              "video.")


def output_warnings(frames: np.ndarray) -> list[OutputWarning]:
    """Warnings for a uint8 [frames, height, width, 3] clip; none for a normal one.

    At most one: a blank clip is also flat and frozen, and a flat one frozen, but the most
    specific finding is the one a person can act on."""
    count = len(frames)
    sampled = _sample(frames)
    luma = _luma(sampled)
    mean_luma = float(luma.mean())
    if _share(luma > NEAR_BLACK) <= STRAY_SHARE:
        return [OutputWarning(code="blank_output", message=f"all {count} frames are nearly black "
                              f"(mean luma {mean_luma:.1f}/255); {TRY_AGAIN}")]
    if _share(luma < NEAR_WHITE) <= STRAY_SHARE:
        return [OutputWarning(code="blank_output", message=f"all {count} frames are nearly white "
                              f"(mean luma {mean_luma:.1f}/255); {TRY_AGAIN}")]
    colour = np.median(sampled.reshape(-1, 3), axis=0)
    if _share((np.abs(sampled.astype(np.int16) - colour.astype(np.int16)) > FLAT_TOLERANCE).any(axis=-1)) \
            <= STRAY_SHARE:
        rgb = ", ".join(str(int(c)) for c in colour)
        return [OutputWarning(code="constant_output", message=f"all {count} frames are one flat colour "
                              f"(RGB {rgb}); {TRY_AGAIN}")]
    if count > 1:
        change = float(np.abs(luma[1:] - luma[0]).mean(axis=(1, 2)).max())
        if change <= FROZEN_CHANGE:
            return [OutputWarning(code="frozen_output", message=f"all {count} frames are nearly identical "
                                  f"(mean change from the first at most {change:.2f}/255), so nothing moves; "
                                  "try another seed, or a prompt that describes motion")]
    return []


def chunk_warnings(frames: np.ndarray, index: int) -> list[OutputWarning]:
    """`output_warnings` of chunk `index` of a video, naming it (numbered from 1 in the message)."""
    return [w.model_copy(update={"chunk": index, "message": f"chunk {index + 1}: {w.message}"})
            for w in output_warnings(frames)]


def video_warnings(whole: list[OutputWarning], chunks: list[OutputWarning]) -> list[OutputWarning]:
    """A finished video's warnings: the whole video's, then each chunk's that says something else
    (a video blank from end to end is not also called blank chunk by chunk)."""
    said = {w.code for w in whole}
    return [*whole, *(w for w in chunks if w.code not in said)]


def _sample(frames: np.ndarray) -> np.ndarray:
    picked = np.linspace(0, len(frames) - 1, min(len(frames), MAX_FRAMES)).round().astype(int)
    stride = max(1, -(-max(frames.shape[1:3]) // MAX_SIDE))
    return frames[picked, ::stride, ::stride]


def _luma(frames: np.ndarray) -> np.ndarray:
    return frames.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)  # BT.601


def _share(mask: np.ndarray) -> float:
    """The largest share of pixels set in any one frame."""
    return float(mask.reshape(len(mask), -1).mean(axis=1).max())
