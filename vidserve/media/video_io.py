"""Video I/O: frames in and out of MP4 (ffmpeg), probing uploads, thumbnails.

Frames are always uint8 numpy arrays shaped [N, H, W, 3] (RGB). No torch here, so the API
process and the CLI can import this without pulling in the model stack.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import ffmpeg
import imageio_ffmpeg
import numpy as np
from PIL import Image

from vidserve.errors import InvalidRequest


@lru_cache(maxsize=1)
def ffmpeg_exe() -> str:
    # There is no system ffmpeg to rely on; imageio-ffmpeg ships a static binary with libx264.
    # Resolved lazily because the lookup touches the filesystem.
    return imageio_ffmpeg.get_ffmpeg_exe()


def stderr_tail(stderr: bytes, lines: int = 5) -> str:
    """The last lines of ffmpeg's log, where it says why it failed."""
    return "\n".join(stderr.decode(errors="replace").strip().splitlines()[-lines:])


def check_frames(frames: np.ndarray) -> None:
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8:
        raise ValueError(f"frames must be a uint8 numpy array, got {getattr(frames, 'dtype', type(frames))}")
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be shaped [N, H, W, 3], got {list(frames.shape)}")
    if frames.shape[0] < 1:
        raise ValueError("frames must contain at least one frame")


def encode_mp4(frames: np.ndarray, path: str | Path, fps: int, crf: int = 18, fragmented: bool = False) -> Path:
    """Encode RGB frames as an H.264/yuv420p MP4 that browsers can stream, atomically; with
    `fragmented`, as a CMAF file (an empty index, then the frames in fragments) that HLS cuts
    into its init and media segments (`media/hls.py`)."""
    check_frames(frames)
    _, h, w, _ = frames.shape
    if h % 2 or w % 2:
        # yuv420p stores chroma at half resolution, so libx264 rejects odd sizes.
        raise ValueError(f"width and height must be even for yuv420p, got {w}x{h}")
    path = Path(path)
    # Encode next to the target and rename, so a reader never sees a half-written file.
    # (Not mkstemp: its 0600 mode would survive the rename and hide the video from a web server.)
    tmp = str(path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp"))
    # faststart: moov before mdat, so playback can start before the download ends. A fragmented
    # file has no B-frames: x264's reordering delay varies from one encode to the next, and would
    # leave gaps or overlaps where one chunk's segment meets the next.
    movflags, reorder = ("+frag_keyframe+empty_moov+default_base_moof+cmaf", {"bf": 0}) if fragmented \
        else ("+faststart", {})
    stream = ffmpeg.input("pipe:", format="rawvideo", pix_fmt="rgb24", s=f"{w}x{h}", framerate=fps).output(
        tmp,
        format="mp4",  # the temp name has no .mp4 suffix to infer it from
        vcodec="libx264",
        pix_fmt="yuv420p",
        crf=crf,
        movflags=movflags,
        # libx264 is deterministic already; these make the bytes depend only on the frames:
        # bitexact drops the muxer's "Lavf<version>" tag, -map_metadata -1 any inherited tags,
        # and a fixed thread count stops x264's options SEI ("threads=N") following the CPU count.
        fflags="+bitexact",
        map_metadata=-1,
        threads=8,
        **reorder,
    )
    try:
        stream.run(cmd=ffmpeg_exe(), input=frames.tobytes(), quiet=True, overwrite_output=True)
        os.replace(tmp, path)
    except ffmpeg.Error as exc:
        raise RuntimeError(f"ffmpeg failed to encode {path}:\n{stderr_tail(exc.stderr)}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def read_video(path: str | Path) -> tuple[np.ndarray, float]:
    """Decode every frame of a video as uint8 RGB; returns (frames [N, H, W, 3], fps)."""
    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    meta = next(reader)
    w, h = meta["size"]
    frames = np.stack([np.frombuffer(buf, np.uint8).reshape(h, w, 3) for buf in reader])
    return frames, float(meta["fps"])


def read_video_bytes(data: bytes) -> tuple[np.ndarray, float]:
    """`read_video` of an MP4 held in memory (an upload, or a file from storage)."""
    with tempfile.TemporaryDirectory(prefix="vidserve-read-") as tmp:
        path = Path(tmp) / "video.mp4"
        path.write_bytes(data)
        return read_video(path)


@dataclass(frozen=True)
class VideoInfo:
    """What `probe_video` reads from a video's headers and packets, without decoding a frame."""

    width: int
    height: int
    frames: int
    fps: float


PROBE_TIMEOUT_SECONDS = 30
# Uploads are read as MP4/MOV only: left to guess, ffmpeg would follow a playlist's references
# (an HLS file naming local paths or URLs).
_MP4_INPUT = ["-f", "mov"]
_VIDEO_STREAM = re.compile(r"Stream #0:[0-9]+\S*: Video: (.*)")
_STREAM_SIZE = re.compile(r", ([0-9]{1,6})x([0-9]{1,6})[ ,]")
_STREAM_FPS = re.compile(r", ([0-9]{1,6}(?:\.[0-9]{1,6})?) fps[ ,]")
_FRAME_COUNT = re.compile(r"frame=\s*([0-9]{1,12})")


def probe_video(data: bytes) -> VideoInfo:
    """Size, frame count and rate of a video's first video stream, so an upload can be refused before
    it is decoded (a few KB of MP4 can hold hundreds of large frames). ffmpeg copies the
    stream's packets to nowhere: it demuxes, never decodes. InvalidRequest if it is no video."""
    def invalid(reason: str) -> InvalidRequest:
        return InvalidRequest(f"the uploaded video {reason}; send an MP4 (H.264)", param="video",
                              code="invalid_video")

    with tempfile.TemporaryDirectory(prefix="vidserve-probe-") as tmp:
        path = Path(tmp) / "video"
        path.write_bytes(data)
        try:
            run = subprocess.run([ffmpeg_exe(), "-hide_banner", "-nostdin", *_MP4_INPUT, "-i", str(path),
                                  "-map", "0:v:0", "-c", "copy", "-f", "null", "-"], capture_output=True,
                                 timeout=PROBE_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            raise invalid(f"took over {PROBE_TIMEOUT_SECONDS} s to read") from None
    report = run.stderr.decode(errors="replace")
    stream = _VIDEO_STREAM.search(report.split("Stream mapping:")[0])  # the input's streams, not the output's
    if run.returncode != 0 or stream is None:
        raise invalid("could not be read or has no video stream")
    size, fps, counts = _STREAM_SIZE.search(stream.group(1)), _STREAM_FPS.search(stream.group(1)), \
        _FRAME_COUNT.findall(report)
    if size is None or fps is None or float(fps.group(1)) <= 0 or not counts:
        raise invalid("has no readable frame size, frame rate or frame count")
    return VideoInfo(width=int(size.group(1)), height=int(size.group(2)), frames=int(counts[-1]),
                     fps=float(fps.group(1)))


def read_last_frame(data: bytes) -> tuple[Image.Image, int, float]:
    """(the last frame, how many frames, fps) of a video, decoding one frame at a time and
    keeping only the latest, so memory stays one frame whatever the video's length."""
    with tempfile.TemporaryDirectory(prefix="vidserve-read-") as tmp:
        path = Path(tmp) / "video.mp4"
        path.write_bytes(data)
        reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24", input_params=_MP4_INPUT)
        meta = next(reader)
        count, last = 0, None
        for last in reader:
            count += 1
        if last is None:
            raise ValueError("the video has no frames")
        return Image.frombytes("RGB", meta["size"], last), count, float(meta["fps"])


def save_thumbnail(frames: np.ndarray, path: str | Path, format: str | None = None) -> Path:
    """Save the middle frame as a still (PNG or WebP, from `format` or the file suffix)."""
    check_frames(frames)
    path = Path(path)
    Image.fromarray(frames[len(frames) // 2]).save(path, format=format)
    return path


def last_frame(frames: np.ndarray) -> Image.Image:
    """The final frame as a PIL image, e.g. to seed the next clip of an extension."""
    check_frames(frames)
    return Image.fromarray(frames[-1])
