"""Writing renditions: a video's frames converted to a rendition's frame rate, scaled to its
size and encoded by ffmpeg as its format and codec, tagged with where they came from.

The default MP4 (the `video` variant) is the stream's segments joined (`media/hls.py`), untouched by any of this.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ffmpeg
import numpy as np

from vidserve import __version__
from vidserve.errors import EncodeFailed
from vidserve.media.formats import CODECS, FORMATS
from vidserve.media.frames_archive import FRAME_NAME, write_archive
from vidserve.media import check_frames, ffmpeg_exe, stderr_tail
from vidserve.media.renditions import Rendition
from vidserve.media.retime import retime


@dataclass(frozen=True)
class Encoder:
    name: str  # ffmpeg's
    pix_fmt: str
    quality_option: str  # the option that takes the CRF (or ProRes profile)
    options: tuple[tuple[str, Any], ...] = ()


ENCODERS: dict[str, Encoder] = {
    "h264": Encoder("libx264", "yuv420p", "crf"),
    # hvc1, not hev1: Apple's players only play H.265 MP4s tagged so.
    "h265": Encoder("libx265", "yuv420p", "crf", (("tag:v", "hvc1"), ("x265-params", "log-level=error"))),
    # b:v 0 makes the CRF the only target (libvpx otherwise caps it at a default bitrate);
    # cpu-used 4 is libvpx's usual speed for files (0 is several times slower for little gain).
    "vp9": Encoder("libvpx-vp9", "yuv420p", "crf", (("b:v", 0), ("deadline", "good"), ("cpu-used", 4),
                                                    ("row-mt", 1))),
    # SVT-AV1 over libaom: several times faster at the same quality; preset 8 is its fast end
    # that still beats VP9 on size.
    "av1": Encoder("libsvtav1", "yuv420p", "crf", (("preset", 8),)),
    "prores": Encoder("prores_ks", "yuv422p10le", "profile:v"),
}

# The muxer for each format, and its options. use_metadata_tags: MP4 and MOV keep any tag
# (prompt, seed...), not only the iTunes ones; faststart puts the index first for streaming.
MUXERS: dict[str, dict[str, Any]] = {
    "mp4": {"format": "mp4", "movflags": "+faststart+use_metadata_tags"},
    "mov": {"format": "mov", "movflags": "+faststart+use_metadata_tags"},
    "webm": {"format": "webm"},
    "gif": {"format": "gif"},
    "apng": {"format": "apng", "plays": 0, "vcodec": "apng"},
}
TAGGED = ("mp4", "mov", "webm")  # GIF and APNG have no tags ffmpeg writes
# palettegen's time grows with the pixels it counts (40 s for 81 frames at 832x480): a GIF's
# palette is taken from the frames at this width, which have the same colours.
PALETTE_WIDTH = 160


@dataclass(frozen=True)
class Provenance:
    """Where a video came from: written as tags into each rendition that holds them."""

    prompt: str
    model: str
    seed: int

    def tags(self) -> dict[str, str]:
        return {"prompt": self.prompt, "model": self.model, "seed": str(self.seed), "vidserve_version": __version__}


class Renderer:
    """The renditions of one video's frames (uint8 [N, H, W, 3] at `fps`). A frame rate
    conversion is kept for the next rendition at that rate."""

    def __init__(self, frames: np.ndarray, fps: int, provenance: Provenance):
        check_frames(frames)
        self.frames, self.fps, self.provenance = frames, fps, provenance
        self._converted: tuple[tuple[int, str | None], np.ndarray] | None = None

    def write(self, rendition: Rendition, path: str | Path) -> Path:
        """`rendition` at `path`; EncodeFailed if ffmpeg cannot make it."""
        frames = self._at_rate(rendition)
        path = Path(path)
        if rendition.format == "frames":
            return self._write_frames(frames, rendition, path)
        muxer = dict(MUXERS[rendition.format])
        if rendition.codec is not None:
            encoder = ENCODERS[rendition.codec]
            quality = rendition.quality
            value = CODECS[rendition.codec].levels[quality] if isinstance(quality, str) else quality
            muxer.update({"vcodec": encoder.name, "pix_fmt": encoder.pix_fmt, encoder.quality_option: value,
                          **dict(encoder.options)})
        tags = self.provenance.tags() if rendition.format in TAGGED else {}
        self._run(frames, rendition, path, muxer, tags)
        return path

    def _at_rate(self, rendition: Rendition) -> np.ndarray:
        if rendition.fps_mode is None:
            return self.frames
        key = (rendition.fps, rendition.fps_mode)
        if self._converted is None or self._converted[0] != key:
            self._converted = None  # one conversion held at a time: they are the video's size or more
            self._converted = (key, retime(self.frames, self.fps, rendition.fps, rendition.fps_mode))
        return self._converted[1]

    def _write_frames(self, frames: np.ndarray, rendition: Rendition, path: Path) -> Path:
        with tempfile.TemporaryDirectory(prefix="vidserve-frames-") as tmp:
            self._run(frames, rendition, Path(tmp) / FRAME_NAME, {"format": "image2", "vcodec": "png",
                                                                 "start_number": 0}, {})
            p = self.provenance
            manifest = {"fps": rendition.fps, "size": f"{rendition.width}x{rendition.height}", "prompt": p.prompt,
                        "model": p.model, "seed": p.seed, "vidserve_version": __version__}
            return write_archive(sorted(Path(tmp).glob("*.png")), manifest, path)

    def _run(self, frames: np.ndarray, rendition: Rendition, path: Path, options: dict[str, Any],
             tags: dict[str, str]) -> None:
        _, height, width, _ = frames.shape
        stream = ffmpeg.input("pipe:", format="rawvideo", pix_fmt="rgb24", s=f"{width}x{height}",
                              framerate=rendition.fps)
        if (rendition.width, rendition.height) != (width, height):
            stream = stream.filter("scale", rendition.width, rendition.height, flags="lanczos")
        if rendition.format == "gif":
            stream = _with_palette(stream, FORMATS["gif"].quality_levels[rendition.quality], rendition.width)
        args = stream.output(str(path), **options).compile(cmd=ffmpeg_exe(), overwrite_output=True)
        # -metadata takes one tag per flag, which ffmpeg-python's keyword options cannot repeat.
        at = args.index(str(path))
        args[at:at] = [arg for key, value in tags.items() for arg in ("-metadata", f"{key}={value}")]
        run = subprocess.run(args, input=frames.tobytes(), capture_output=True)
        if run.returncode != 0:
            codec = f" ({rendition.codec})" if rendition.codec else ""
            raise EncodeFailed(f"ffmpeg could not write the {rendition.name!r} rendition, {rendition.format}{codec}:\n"
                               f"{stderr_tail(run.stderr)}")


def _with_palette(stream, colours: int, width: int):
    """A GIF's frames mapped to one palette of `colours` made for them (ffmpeg's default,
    a fixed 256-colour palette, bands every gradient)."""
    split = stream.split()
    palette = split[0]
    if width > PALETTE_WIDTH:
        palette = palette.filter("scale", PALETTE_WIDTH, -1, flags="area")
    palette = palette.filter("palettegen", max_colors=colours)
    # Ordered dithering: smaller files than error diffusion, and no crawling noise between frames.
    return ffmpeg.filter([split[1], palette], "paletteuse", dither="bayer", bayer_scale=3)
