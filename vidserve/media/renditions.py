"""What a request may ask for as `outputs`: renditions of the video, each a format, codec,
frame rate, quality and size, made beside the default H.264 MP4 (the `video` variant).

`OutputRequest` is the contract: types, and combinations that can never work (ProRes in
WebM, a CRF for a GIF). `resolve_outputs` checks each against the video (its size, rate and
frames) and the server's limits and fills in every default, giving the `Rendition`s a job
keeps, the worker encodes and the video object shows.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from vidserve.config import Settings
from vidserve.errors import InvalidRequest, echo
from vidserve.media.formats import CODECS, FORMATS, QUALITY_LEVELS, default_codec, is_lossless
from vidserve.media.retime import MIN_INTERPOLATION_SIDE, frame_count

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
# Variants every video has (or, for chunk, a long one): no rendition may take their names.
RESERVED_NAMES = ("video", "thumbnail", "spritesheet", "chunk")
# A GIF holds 8-bit palette frames, uncompressed across time: large and slow past this.
GIF_MAX_SIDE = 480
MIN_SIDE = 16  # x265 refuses smaller frames

FpsMode = Literal["interpolate", "blend"]
_SIZE = re.compile(r"\s*([0-9]{1,6})\s*[xX]\s*([0-9]{1,6})\s*")


def parse_size(size: str) -> tuple[int, int]:
    """'WxH' -> (width, height)."""
    match = _SIZE.fullmatch(size)
    if match is None:
        raise InvalidRequest(f"size must look like WIDTHxHEIGHT (e.g. 832x480), got {echo(size)}", param="size")
    return int(match.group(1)), int(match.group(2))


class OutputRequest(BaseModel):
    """One rendition as a client asks for it; every field has a default."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["mp4", "webm", "mov", "gif", "apng", "frames"] = Field(
        "mp4", description="frames: a ZIP of lossless PNG frames with a manifest.json.")
    codec: Literal["h264", "h265", "vp9", "av1", "prores"] | None = Field(
        None, description="mp4: h264 (default), h265, av1; webm: vp9 (default), av1; mov: prores (default), h264, "
                          "h265; none for gif, apng, frames.")
    fps: int | None = Field(None, ge=1, le=60, description="Frames per second; the video's own if unset.")
    fps_mode: FpsMode = Field("interpolate", description="How another frame rate is reached: interpolate "
                              "(motion-compensated, ffmpeg minterpolate) or blend (mixing neighbouring frames, "
                              "ffmpeg framerate; much faster).")
    quality: int | Literal["low", "medium", "high"] | None = Field(
        None, description="A CRF on the codec's scale (h264/h265 0-51, vp9 0-63, av1 1-63) or low/medium/high "
                          "(ProRes profile LT/422/HQ, GIF palette 64/128/256 colours); high if unset. "
                          "apng and frames are lossless and take none.")
    size: str | None = Field(None, description="WIDTHxHEIGHT: the video scaled, its aspect ratio kept (never "
                             "cropped or padded); the video's size if unset (a GIF's at most 480 a side).")
    name: str | None = Field(None, pattern=NAME_PATTERN, description="The variant to download it as; by default "
                             "the format, with the codec if not the format's default (mp4-av1).")

    @field_validator("codec")
    @classmethod
    def _codec_fits_format(cls, codec: str | None, info: ValidationInfo) -> str | None:
        format = info.data.get("format")
        if codec is not None and format is not None and codec not in FORMATS[format].codecs:
            takes = ", ".join(FORMATS[format].codecs)
            raise ValueError(f"{format} takes {takes}, not {codec}" if takes else f"{format} takes no codec")
        return codec

    @field_validator("quality", mode="before")
    @classmethod
    def _crf_or_level(cls, quality: Any) -> Any:
        """One message for any other value (pydantic's names each member of the union); a CRF
        may come as digits (the CLI's --output)."""
        if isinstance(quality, str) and re.fullmatch(r"[0-9]{1,3}", quality):
            return int(quality)
        if quality is None or quality in QUALITY_LEVELS or (isinstance(quality, int) and not isinstance(quality, bool)):
            return quality
        raise ValueError(f"quality is a CRF (a whole number) or one of {', '.join(QUALITY_LEVELS)}")

    @field_validator("quality")
    @classmethod
    def _quality_fits_codec(cls, quality: int | str | None, info: ValidationInfo) -> int | str | None:
        format = info.data.get("format")
        if quality is None or format is None or "codec" not in info.data:
            return quality  # nothing to check, or format or codec failed already
        if is_lossless(format):
            raise ValueError(f"{format} is lossless and takes no quality")
        if isinstance(quality, str):
            return quality
        codec = info.data["codec"] or default_codec(format)
        crf = CODECS[codec].crf if codec is not None else None
        if crf is None:
            raise ValueError(f"{codec or format} takes a named quality: {', '.join(QUALITY_LEVELS)}")
        if not crf[0] <= quality <= crf[1]:
            raise ValueError(f"{codec}'s CRF runs from {crf[0]} to {crf[1]}")
        return quality

    @property
    def variant(self) -> str:
        if self.name is not None:
            return self.name
        default = default_codec(self.format)
        return self.format if self.codec in (None, default) else f"{self.format}-{self.codec}"


class Rendition(BaseModel):
    """One output of a job with every choice made: what the worker encodes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    format: str
    codec: str | None  # None: the format is its own (gif, apng, PNG frames)
    fps: int
    fps_mode: FpsMode | None  # None: the video's own rate, nothing converted
    quality: int | str | None  # None: lossless
    width: int
    height: int

    @property
    def media_type(self) -> str:
        return FORMATS[self.format].media_type

    @property
    def filename(self) -> str:
        return self.name + FORMATS[self.format].extension

    def describe(self, source_frames: int, source_fps: int, size_bytes: int | None) -> dict[str, Any]:
        """What it holds, for the video object: `source_frames` at `source_fps` are the video's."""
        return {"name": self.name, "format": self.format, "media_type": self.media_type, "codec": self.codec,
                "fps": self.fps, "fps_mode": self.fps_mode, "quality": self.quality,
                "size": f"{self.width}x{self.height}", "frames": frame_count(source_frames, source_fps, self.fps),
                "bytes": size_bytes, "filename": self.filename}


def resolve_outputs(asked: list[OutputRequest] | None, width: int, height: int, fps: int, frames: int,
                    settings: Settings) -> tuple[Rendition, ...]:
    """The renditions of a `frames`-frame video of `width`x`height` at `fps`, each named apart."""
    if not asked:
        return ()
    if len(asked) > settings.max_outputs:
        raise InvalidRequest(f"outputs: at most {settings.max_outputs} renditions, got {len(asked)}",
                             param="outputs")
    renditions: list[Rendition] = []
    for index, output in enumerate(asked):
        rendition = resolve_output(output, f"outputs.{index}", width, height, fps, frames, settings)
        if rendition.name in RESERVED_NAMES:
            raise InvalidRequest(f"outputs.{index}.name: every video has a {rendition.name!r} variant; name this "
                                 "rendition otherwise", param=f"outputs.{index}.name")
        taken = next((i for i, other in enumerate(renditions) if other.name == rendition.name), None)
        if taken is not None:
            raise InvalidRequest(f"outputs.{index}.name: outputs.{taken} is named {rendition.name!r} too; give "
                                 "each rendition a name of its own", param=f"outputs.{index}.name")
        renditions.append(rendition)
    return tuple(renditions)


def resolve_output(output: OutputRequest, param: str, width: int, height: int, fps: int, frames: int,
                   settings: Settings) -> Rendition:
    """One rendition; `param` names it in errors."""
    target_fps = output.fps or fps
    converted = target_fps != fps and frames > 1
    if converted and output.fps_mode == "interpolate" and min(width, height) < MIN_INTERPOLATION_SIDE:
        raise InvalidRequest(f"{param}.fps_mode: motion interpolation needs a video at least "
                             f"{MIN_INTERPOLATION_SIDE} pixels a side, this one is {width}x{height}; use blend",
                             param=f"{param}.fps_mode")
    count = frame_count(frames, fps, target_fps)
    if count > settings.max_output_frames:
        raise InvalidRequest(f"{param}.fps: {frames} frames at {fps} fps make {count} at {target_fps} fps; the limit "
                             f"is {settings.max_output_frames} frames", param=f"{param}.fps")
    codec = output.codec or default_codec(output.format)
    out_width, out_height = _size(output, param, width, height, settings)
    if codec is not None and (out_width % 2 or out_height % 2):
        raise InvalidRequest(f"{param}.size: {codec} needs an even width and height, got {out_width}x{out_height}",
                             param=f"{param}.size")
    quality = output.quality if output.quality is not None or is_lossless(output.format) else "high"
    return Rendition(name=output.variant, format=output.format, codec=codec, fps=target_fps,
                     fps_mode=output.fps_mode if converted else None, quality=quality, width=out_width,
                     height=out_height)


def _size(output: OutputRequest, param: str, width: int, height: int, settings: Settings) -> tuple[int, int]:
    if output.size is None:
        longest = max(width, height)
        if output.format != "gif" or longest <= GIF_MAX_SIDE:
            return width, height
        return round(width * GIF_MAX_SIDE / longest), round(height * GIF_MAX_SIDE / longest)
    try:
        out_width, out_height = parse_size(output.size)
    except InvalidRequest as exc:
        raise InvalidRequest(f"{param}.size: {exc.message}", param=f"{param}.size") from None
    if min(out_width, out_height) < MIN_SIDE or max(out_width, out_height) > settings.max_output_side:
        raise InvalidRequest(f"{param}.size: {out_width}x{out_height} is outside {MIN_SIDE} to "
                             f"{settings.max_output_side} pixels a side", param=f"{param}.size")
    # Either side may be rounded (to an even number, say), by up to a pixel.
    if abs(out_height - out_width * height / width) > 1 and abs(out_width - out_height * width / height) > 1:
        fitting = 2 * round(out_width * height / width / 2)
        raise InvalidRequest(f"{param}.size: {out_width}x{out_height} would change the aspect ratio of the "
                             f"{width}x{height} video; a rendition is scaled, never cropped or padded (e.g. "
                             f"{out_width}x{fitting})", param=f"{param}.size")
    return out_width, out_height
