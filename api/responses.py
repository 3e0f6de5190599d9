"""The response contract beside the video object (`vidserve.jobs.video_object.VideoObject`):
lists, deletions and errors, served as named schemas in /openapi.json."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from vidserve.jobs.video_object import VideoObject


class VideoList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VideoObject]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def of(cls, videos: list[VideoObject], has_more: bool) -> "VideoList":
        return cls(data=videos, first_id=videos[0].id if videos else None,
                   last_id=videos[-1].id if videos else None, has_more=has_more)


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool = True


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error the API answers, whatever its status: OpenAI's shape."""

    error: ErrorDetail
