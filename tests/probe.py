"""What ffmpeg reads from a media file: the same binary vidserve encodes with (imageio-ffmpeg
ships no ffprobe), decoding every frame so the count is what a player shows."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from vidserve.media import ffmpeg_exe


@dataclass(frozen=True)
class Probe:
    codec: str  # ffmpeg's name: h264, hevc, vp9, av1, prores, gif, apng
    width: int
    height: int
    fps: float  # the stream's base rate (tbr): a GIF's average rate is skewed by its last frame's delay
    frames: int
    tags: dict[str, str]  # container tags, keys lower-cased (Matroska upper-cases them)


def probe(path: str | Path) -> Probe:
    run = subprocess.run([ffmpeg_exe(), "-hide_banner", "-nostdin", "-i", str(path), "-map", "0:v:0", "-f", "null",
                          "-"], capture_output=True, text=True, check=True)
    inputs = run.stderr.split("Stream mapping:")[0]
    stream = re.search(r"Stream #0:\d+\S*: Video: (\w+)(.*)", inputs)
    size = re.search(r", (\d+)x(\d+)", stream.group(2))
    fps = re.search(r", ([\d.]+)k? tbr", stream.group(2))
    return Probe(codec=stream.group(1), width=int(size.group(1)), height=int(size.group(2)),
                 fps=float(fps.group(1)), frames=int(re.findall(r"frame=\s*(\d+)", run.stderr)[-1]), tags=tags(path))


def tags(path: str | Path) -> dict[str, str]:
    """The container's tags, as ffmpeg's ffmetadata writer lists them."""
    run = subprocess.run([ffmpeg_exe(), "-hide_banner", "-nostdin", "-i", str(path), "-f", "ffmetadata", "-"],
                         capture_output=True, text=True, check=True)
    pairs = (line.partition("=") for line in run.stdout.splitlines()[1:] if "=" in line)
    return {key.lower(): value for key, _, value in pairs}
