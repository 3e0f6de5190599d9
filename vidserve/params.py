"""A job's generation parameters: typed, frozen, and stored in the job record.

`build_request` resolves and validates what a client asked for into a `GenerationRequest`;
`JobParams.of` keeps the serializable part of it on the job, and `to_request` gives the
worker the same request back. The field names are the request's, so both conversions
carry every field by name: a field added to both classes travels without more code.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vidserve.loras import LoraRequest
from vidserve.options import AttentionOptions, CacheOptions
from vidserve.media.renditions import Rendition
from vidserve.requests import GenerationRequest


class JobParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    width: int
    height: int
    num_frames: int  # frames generated; an extension's new frames only (see source_frames)
    fps: int
    steps: int
    guidance: float
    seed: int
    negative_prompt: str = ""
    chunk_frames: tuple[int, ...]
    prompts: tuple[str, ...] = ()
    drift_correction: Literal["color", "none"] = "color"
    attention: AttentionOptions = AttentionOptions()
    cache: CacheOptions = CacheOptions()
    prompt_extend: bool = False
    caption_chain: bool = False
    loras: tuple[LoraRequest, ...] = ()
    preset: str | None = None
    flow_shift: float | None = None
    # Not part of the request: what the video object reports, and what is encoded from the frames.
    seconds: str = Field(description="The video's length as OpenAI reports it: the seconds asked for, or, for an "
                                     "extension, the stitched total.")
    source_frames: int = Field(0, ge=0, description="Frames of the video an extension continues (0: none).")
    outputs: tuple[Rendition, ...] = Field((), description="Renditions the worker encodes once the video is made.")

    @classmethod
    def of(cls, request: GenerationRequest, seconds: str, source_frames: int = 0,
           outputs: tuple[Rendition, ...] = ()) -> "JobParams":
        fields = {name: getattr(request, name) for name in _REQUEST_FIELDS}
        return cls(**fields, seconds=seconds, source_frames=source_frames, outputs=outputs)

    def to_request(self, model: str, prompt: str, image: Any = None) -> GenerationRequest:
        """The request the API validated; `image` is the first frame, or the last frame of the
        video an extension continues."""
        fields = {name: getattr(self, name) for name in _REQUEST_FIELDS}
        fields["chunk_frames"], fields["prompts"] = list(self.chunk_frames), list(self.prompts)
        return GenerationRequest(model=model, prompt=prompt, image=image, continuing=self.source_frames > 0,
                                 **fields)


# The fields a job keeps of its request. model, prompt and image live on the job itself
# (the image as a stored file); `continuing` is whether source_frames is set.
_REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(GenerationRequest)
                        if f.name not in ("model", "prompt", "image", "continuing"))
