"""HLS of a video while it is made: each finished chunk becomes a CMAF (fragmented MP4) media
segment behind one init segment, and `media_playlist` lists them (RFC 8216, version 7).

A chunk is encoded once (`encode_mp4(fragmented=True)`), so its fragment's decode times start
at 0; `Segment.at` moves them to where the chunk starts in the video, so that players (and
ffmpeg) read the segments as one timeline. The init segment (ftyp + moov) depends only on the
frame size, rate and encoder settings: every chunk of a video has the same one. The chunk's
MP4 and the whole video are these same encoded frames, joined (`join_segments`): what the
stream plays is exactly what downloads.
"""

from __future__ import annotations

import math
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from vidserve.media import encode_mp4, ffmpeg_exe, stderr_tail

_CONTAINERS = {b"moov", b"trak", b"mdia", b"moof", b"traf"}


@dataclass(frozen=True)
class Segment:
    """A chunk encoded as CMAF, its decode times from 0."""

    init: bytes  # ftyp + moov
    media: bytes  # moof + mdat pairs
    frames: int
    fps: int

    @property
    def seconds(self) -> float:
        return self.frames / self.fps

    def at(self, start_frame: int) -> bytes:
        """The media segment, its decode times moved on to frame `start_frame` of the video."""
        timescale = _timescale(self.init)
        if timescale % self.fps:
            raise ValueError(f"the track's timescale {timescale} is not a whole number of ticks per frame at "
                             f"{self.fps} fps")
        media = bytearray(self.media)
        _shift_decode_times(media, start_frame * (timescale // self.fps))
        return bytes(media)


def encode_segment(frames: np.ndarray, fps: int) -> Segment:
    """`frames` as a CMAF segment, encoded as the video is (`encode_mp4`, fragmented)."""
    with tempfile.TemporaryDirectory(prefix="vidserve-segment-") as tmp:
        data = encode_mp4(frames, Path(tmp) / "segment.mp4", fps=fps, fragmented=True).read_bytes()
    top = list(_boxes(data, 0, len(data)))
    first_moof = next((offset for kind, offset, _, _ in top if kind == b"moof"), None)
    if first_moof is None:
        raise ValueError("not a fragmented MP4: it has no moof box")
    # Not mfra: an index of the whole file, wrong in a segment.
    media = b"".join(data[offset:offset + size] for kind, offset, size, _ in top if kind in (b"moof", b"mdat"))
    return Segment(init=data[:first_moof], media=media, frames=len(frames), fps=fps)


class Timeline:
    """A video's segments so far, each placed after the ones before it: its stream as it grows,
    and at the end the whole video."""

    def __init__(self) -> None:
        self.init = b""
        self.media: list[bytes] = []
        self.frames = 0

    def add(self, segment: Segment) -> bytes:
        """`segment`'s media, placed after the segments before it."""
        self.init = self.init or segment.init
        media = segment.at(self.frames)
        self.media.append(media)
        self.frames += segment.frames
        return media

    def add_placed(self, init: bytes, media: bytes, frames: int) -> None:
        """A segment `add` placed before (read back from storage, as a rerun goes on from it)."""
        self.init = self.init or init
        self.media.append(media)
        self.frames += frames

    def join(self, path: str | Path) -> Path:
        return join_segments(self.init, self.media, path)


def join_segments(init: bytes, media: Sequence[bytes], path: str | Path) -> Path:
    """An ordinary MP4 (index first) of the media segments behind `init`, in order: the same
    encoded frames, copied, never encoded again."""
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="vidserve-join-") as tmp:
        joined = Path(tmp) / "joined.mp4"
        joined.write_bytes(init + b"".join(media))
        run = subprocess.run([ffmpeg_exe(), "-hide_banner", "-nostdin", "-y", "-i", str(joined), "-c", "copy",
                              "-movflags", "+faststart", "-fflags", "+bitexact", "-map_metadata", "-1",
                              "-f", "mp4", str(path)], capture_output=True)
    if run.returncode != 0:
        raise RuntimeError(f"ffmpeg failed to join segments into {path}:\n{stderr_tail(run.stderr)}")
    return path


def media_playlist(init_uri: str, segments: Sequence[tuple[str, float]], target_seconds: int, ended: bool) -> str:
    """An EVENT media playlist: `segments` are (URI, seconds) in order; `ended` closes it. With
    no segment yet it names no init segment either: there is none to fetch."""
    lines = ["#EXTM3U", "#EXT-X-VERSION:7", f"#EXT-X-TARGETDURATION:{target_seconds}",
             "#EXT-X-MEDIA-SEQUENCE:0", "#EXT-X-PLAYLIST-TYPE:EVENT", "#EXT-X-INDEPENDENT-SEGMENTS"]
    if segments:
        lines.append(f'#EXT-X-MAP:URI="{init_uri}"')
    for uri, seconds in segments:
        lines += [f"#EXTINF:{seconds:.3f},", uri]
    if ended:
        lines.append("#EXT-X-ENDLIST")
    return "\n".join(lines) + "\n"


def target_seconds(longest_segment_seconds: float) -> int:
    """EXT-X-TARGETDURATION: no segment may last longer once rounded to whole seconds, and it
    may not change while the playlist grows, so it is set from the longest chunk planned."""
    return max(1, math.ceil(longest_segment_seconds))


def _boxes(data: bytes | bytearray, start: int, end: int) -> Iterator[tuple[bytes, int, int, int]]:
    """(type, offset, size, header size) of each box between `start` and `end`."""
    offset = start
    while offset + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, offset)
        header = 8
        if size == 1:
            size, header = struct.unpack_from(">Q", data, offset + 8)[0], 16
        elif size == 0:
            size = end - offset
        if size < header or offset + size > end:
            raise ValueError(f"a malformed {kind!r} box at byte {offset}")
        yield kind, offset, size, header
        offset += size


def _find(data: bytes | bytearray, path: tuple[bytes, ...], start: int = 0, end: int | None = None
          ) -> Iterator[tuple[int, int, int]]:
    """(offset, size, header size) of every box at `path` (types from the top level down)."""
    end = len(data) if end is None else end
    for kind, offset, size, header in _boxes(data, start, end):
        if kind != path[0]:
            continue
        if len(path) == 1:
            yield offset, size, header
        elif kind in _CONTAINERS:
            yield from _find(data, path[1:], offset + header, offset + size)


def _timescale(init: bytes) -> int:
    """The video track's ticks per second (its mdhd)."""
    for offset, _, header in _find(init, (b"moov", b"trak", b"mdia", b"mdhd")):
        version = init[offset + header]
        # version, flags; creation and modification times (32 or 64 bits each); then the timescale.
        return struct.unpack_from(">I", init, offset + header + 4 + (16 if version == 1 else 8))[0]
    raise ValueError("the init segment has no mdhd box")


def _shift_decode_times(media: bytearray, ticks: int) -> None:
    """Add `ticks` to each fragment's baseMediaDecodeTime (its tfdt), in place."""
    found = False
    for offset, _, header in _find(media, (b"moof", b"traf", b"tfdt")):
        found = True
        body = offset + header
        if media[body] == 1:
            struct.pack_into(">Q", media, body + 4, struct.unpack_from(">Q", media, body + 4)[0] + ticks)
        else:
            value = struct.unpack_from(">I", media, body + 4)[0] + ticks
            if value >= 2 ** 32:
                raise ValueError("a version 0 tfdt cannot hold the segment's decode time")
            struct.pack_into(">I", media, body + 4, value)
    if not found:
        raise ValueError("the fragments have no tfdt box")
