"""The files a rendition can be: containers, the codecs each takes, and what `quality` means
for each codec. Plain facts, shared by the request contract (vidserve/media/renditions.py) and
the encoder (vidserve/media/renderer.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

QUALITY_LEVELS = ("low", "medium", "high")


@dataclass(frozen=True)
class Format:
    media_type: str
    extension: str
    codecs: tuple[str, ...] = ()  # the first is the default; none: the format is its own codec
    quality_levels: dict[str, int] = field(default_factory=dict)  # for a format without codecs (GIF's palette)


@dataclass(frozen=True)
class Codec:
    crf: tuple[int, int] | None  # the CRF range a numeric quality must fall in; None: named levels only
    levels: dict[str, int]  # named level -> the encoder's CRF (or ProRes profile)


FORMATS: dict[str, Format] = {
    "mp4": Format("video/mp4", ".mp4", ("h264", "h265", "av1")),
    "webm": Format("video/webm", ".webm", ("vp9", "av1")),
    "mov": Format("video/quicktime", ".mov", ("prores", "h264", "h265")),
    # A GIF's quality is its palette's size: at most 256 colours, fewer make a smaller file.
    "gif": Format("image/gif", ".gif", quality_levels={"high": 256, "medium": 128, "low": 64}),
    "apng": Format("image/apng", ".apng"),  # lossless
    "frames": Format("application/zip", ".zip"),  # lossless PNGs
}

# "high" is what the default MP4 uses (CRF 18 on H.264); the others are about the same
# picture on each codec's own CRF scale.
CODECS: dict[str, Codec] = {
    "h264": Codec((0, 51), {"high": 18, "medium": 23, "low": 28}),
    "h265": Codec((0, 51), {"high": 20, "medium": 26, "low": 30}),
    "vp9": Codec((0, 63), {"high": 24, "medium": 31, "low": 38}),
    "av1": Codec((1, 63), {"high": 28, "medium": 35, "low": 45}),
    # ProRes has profiles, not a CRF: high is 422 HQ, medium 422, low 422 LT.
    "prores": Codec(None, {"high": 3, "medium": 2, "low": 1}),
}


def default_codec(format: str) -> str | None:
    codecs = FORMATS[format].codecs
    return codecs[0] if codecs else None


def is_lossless(format: str) -> bool:
    """APNG and PNG frames keep every pixel: there is no quality to choose."""
    return not FORMATS[format].codecs and not FORMATS[format].quality_levels
