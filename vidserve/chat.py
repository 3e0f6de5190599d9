"""Chat messages in OpenAI's shape (`Message`: the chat request's, and the video path's own
calls to the LLM), and from that shape to a model's: text parts, and images decoded from
`image_url` parts (data URLs always; http(s) only when the server allows it, and then
only from hosts that vidserve.outbound allows).

Every image is bounded before a model's processor sees it: its decoded size, its aspect
ratio (a processor that scales the short side to a fixed length turns a thin strip into a
huge array), and whatever else the caller's `check_image` asks (the model's own scaled size).
"""

from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass
from typing import Annotated, Callable, Literal
from urllib.parse import urlsplit

import httpx
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from vidserve import outbound
from vidserve.errors import InvalidRequest, echo
from vidserve.media import decode_data_url, load_image

# The longest side of a chat image may be at most this many times its shortest.
MAX_ASPECT_RATIO = 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImageURL(_Strict):
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageURL


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. `name`, `refusal` on replayed assistant turns

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[Part] | None = None


@dataclass(frozen=True)
class ChatImage:
    image: Image.Image
    digest: str  # content hash: the key of the model's image-feature cache

    @classmethod
    def from_bytes(cls, data: bytes, max_pixels: int) -> "ChatImage":
        return cls(load_image(data, max_pixels), hashlib.sha256(data).hexdigest())


def to_model_messages(messages: list[Message], *, max_pixels: int, max_bytes: int, remote_images: bool,
                      allow_private_urls: bool = False, check_image: Callable[[Image.Image], None] | None = None
                      ) -> tuple[list[dict], list[ChatImage]]:
    """OpenAI messages -> (transformers chat messages, their images in order). `check_image`
    sees each decoded image and may refuse it with InvalidRequest."""
    converted, images = [], []
    for i, message in enumerate(messages):
        content = message.content
        if content is None or isinstance(content, str):
            converted.append({"role": message.role, "content": content or ""})
            continue
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, TextPart):
                parts.append({"type": "text", "text": part.text})
                continue
            param = f"messages[{i}].content[{j}].image_url"
            data = _image_bytes(part.image_url.url, param, max_bytes, remote_images, allow_private_urls)
            try:
                image = ChatImage.from_bytes(data, max_pixels)
                _check_aspect_ratio(image.image)
                if check_image is not None:
                    check_image(image.image)
            except InvalidRequest as exc:
                raise InvalidRequest(exc.message, param=param, code=exc.code) from None
            images.append(image)
            parts.append({"type": "image"})
        converted.append({"role": message.role, "content": parts})
    return converted, images


def data_url(image: Image.Image) -> str:
    """A PNG data URL, e.g. to send a video frame to a chat endpoint. A frame more elongated
    than chat images may be is centred on a black band wide enough to be taken."""
    short, long = sorted(image.size)
    if long > MAX_ASPECT_RATIO * short:
        side = -(-long // MAX_ASPECT_RATIO)
        size = (image.width, side) if image.width > image.height else (side, image.height)
        padded = Image.new(image.mode, size)
        padded.paste(image, ((size[0] - image.width) // 2, (size[1] - image.height) // 2))
        image = padded
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _check_aspect_ratio(image: Image.Image) -> None:
    short, long = sorted(image.size)
    if long > MAX_ASPECT_RATIO * short:
        ratio = f"{long / short:,.1f}".removesuffix(".0")
        raise InvalidRequest(f"the image is {image.width}x{image.height}: its long side is {ratio} times its short "
                             f"side, and chat images may be at most {MAX_ASPECT_RATIO} times (crop or pad it)",
                             code="image_aspect_ratio")


def _image_bytes(url: str, param: str, max_bytes: int, remote_images: bool, allow_private: bool) -> bytes:
    if url.startswith("data:"):
        media_type = url[5:].partition(",")[0].partition(";")[0].strip().lower()
        if not media_type.startswith("image/"):
            found = f"of type {echo(media_type)}" if media_type else "without a media type (text/plain)"
            raise InvalidRequest(f"image_url is a data URL {found}; send an image, e.g. data:image/png;base64,<data>",
                                 param=param, code="unsupported_media_type")
        return decode_data_url(url, param, max_bytes)
    if urlsplit(url).scheme not in ("http", "https"):
        raise InvalidRequest("image_url must be a data: URL or an http(s) URL", param=param)
    if not remote_images:
        raise InvalidRequest("this server does not fetch image URLs; send the image as a data: URL "
                             "(the operator can allow fetching with VIDSERVE_CHAT_REMOTE_IMAGES=1)", param=param,
                             code="remote_images_disabled")
    return _fetch(url, param, max_bytes, allow_private)


def _fetch(url: str, param: str, max_bytes: int, allow_private: bool) -> bytes:
    outbound.http_host(url, param)
    try:
        with outbound.client(allow_private, timeout=10) as client, client.stream("GET", url) as response:
            if response.status_code != 200:
                raise InvalidRequest(f"fetching the image gave HTTP {response.status_code}", param=param)
            data = b""
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > max_bytes:
                    raise InvalidRequest(f"the image is larger than the {max_bytes}-byte limit", param=param)
            return data
    except outbound.URLNotAllowed as exc:  # raised when connecting: the host resolves to a non-public address
        raise outbound.URLNotAllowed(exc.message, param=param) from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise InvalidRequest(f"could not fetch the image: {exc}", param=param) from None
