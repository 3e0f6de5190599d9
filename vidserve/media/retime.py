"""Frame rate conversion: a video's frames at another rate, by motion interpolation (ffmpeg's
`minterpolate`) or by blending neighbouring frames (`framerate`).

The converted video spans the same time as the source: its frame k shows time k/fps, from the
first frame to the source's last at (n-1)/source_fps, so it holds (n-1)*fps//source_fps + 1
frames (16 -> 32 fps: 2(n-1)+1). An output frame that falls on a source frame's time is that
source frame, pixel for pixel.
"""

from __future__ import annotations

import math

import ffmpeg
import numpy as np

from vidserve.errors import EncodeFailed
from vidserve.media import ffmpeg_exe, stderr_tail

FILTERS = {"interpolate": "minterpolate", "blend": "framerate"}
# minterpolate matches 16-pixel blocks and fails on a frame under two blocks a side.
MIN_INTERPOLATION_SIDE = 32


def frame_count(frames: int, source_fps: int, fps: int) -> int:
    """Frames of a `frames`-frame video at `source_fps` converted to `fps`."""
    return (frames - 1) * fps // source_fps + 1


def retime(frames: np.ndarray, source_fps: int, fps: int, mode: str) -> np.ndarray:
    """`frames` (uint8 [N, H, W, 3]) at `fps`, converted the way `mode` names."""
    n, h, w, _ = frames.shape
    if fps == source_fps or n == 1:
        return frames
    count = frame_count(n, source_fps, fps)
    # The filters stop short of the last frame's time without a frame after it to reach for.
    padded = np.concatenate([frames, frames[-1:]])
    stream = (ffmpeg.input("pipe:", format="rawvideo", pix_fmt="rgb24", s=f"{w}x{h}", framerate=source_fps)
              .filter(FILTERS[mode], fps=fps)
              .output("pipe:", format="rawvideo", pix_fmt="rgb24", vframes=count))
    try:
        out, _ = stream.run(cmd=ffmpeg_exe(), input=padded.tobytes(), capture_stdout=True, capture_stderr=True)
    except ffmpeg.Error as exc:
        raise EncodeFailed(f"ffmpeg could not convert {source_fps} to {fps} fps ({mode}):\n"
                           f"{stderr_tail(exc.stderr)}") from None
    converted = np.frombuffer(out, np.uint8).reshape(-1, h, w, 3)
    if len(converted) != count:
        raise EncodeFailed(f"converting {n} frames from {source_fps} to {fps} fps gave {len(converted)} frames, "
                           f"not {count}")
    converted = converted.copy()
    # The filters work in YUV, which rounds a colour by one here and there: the frames that
    # fall on a source frame's time are put back as they were.
    for k in range(0, count, fps // math.gcd(fps, source_fps)):
        converted[k] = frames[k * source_fps // fps]
    return converted
