"""A job's generation parameters: typed, frozen, and stored in the job record.

`build_request` resolves and validates what a client asked for into a `GenerationRequest`;
`JobParams.of` keeps the serializable part of it on the job, and `to_request` gives the
worker the same request back. Both are `ResolvedOptions`, so every option travels by name.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from vidserve.media.renditions import Rendition
from vidserve.video_request import GenerationRequest, ResolvedOptions


class JobParams(ResolvedOptions):
    # Not part of the request: what the video object reports, and what is encoded from the frames.
    seconds: str = Field(description="The video's length as OpenAI reports it: the seconds asked for, or, for an "
                                     "extension, the stitched total.")
    source_frames: int = Field(0, ge=0, description="Frames of the video an extension continues (0: none).")
    outputs: tuple[Rendition, ...] = Field((), description="Renditions the worker encodes once the video is made.")

    @classmethod
    def of(cls, request: GenerationRequest, seconds: str, source_frames: int = 0,
           outputs: tuple[Rendition, ...] = ()) -> "JobParams":
        return cls(**_resolved(request), seconds=seconds, source_frames=source_frames, outputs=outputs)

    def to_request(self, model: str, prompt: str, image: Any = None) -> GenerationRequest:
        """The request the API validated; `image` is the first frame, or the last frame of the
        video an extension continues."""
        return GenerationRequest(**_resolved(self), model=model, prompt=prompt, image=image,
                                 continuing=self.source_frames > 0)


def _resolved(options: ResolvedOptions) -> dict[str, Any]:
    # By attribute, not model_dump: nested options stay the validated objects they are.
    return {name: getattr(options, name) for name in ResolvedOptions.model_fields}
