"""Chat messages from OpenAI's shape to a model's: text parts, and images decoded from
`image_url` parts (data URLs always; http(s) only when the server allows it, and then
only from hosts that vidserve.outbound allows)."""

from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from PIL import Image

from vidserve import outbound
from vidserve.errors import InvalidRequest
from vidserve.media import decode_data_url, load_image


@dataclass(frozen=True)
class ChatImage:
    image: Image.Image
    digest: str  # content hash: the key of the model's image-feature cache

    @classmethod
    def from_bytes(cls, data: bytes, max_pixels: int) -> "ChatImage":
        return cls(load_image(data, max_pixels), hashlib.sha256(data).hexdigest())


def to_model_messages(messages: list[dict], *, max_pixels: int, max_bytes: int, remote_images: bool,
                      allow_private_urls: bool = False) -> tuple[list[dict], list[ChatImage]]:
    """OpenAI messages -> (transformers chat messages, their images in order)."""
    converted, images = [], []
    for i, message in enumerate(messages):
        content = message.get("content")
        if content is None or isinstance(content, str):
            converted.append({"role": message["role"], "content": content or ""})
            continue
        parts = []
        for j, part in enumerate(content):
            if part["type"] == "text":
                parts.append({"type": "text", "text": part["text"]})
                continue
            param = f"messages[{i}].content[{j}].image_url"
            data = _image_bytes(part["image_url"]["url"], param, max_bytes, remote_images, allow_private_urls)
            try:
                images.append(ChatImage.from_bytes(data, max_pixels))
            except InvalidRequest as exc:
                raise InvalidRequest(exc.message, param=param, code=exc.code) from None
            parts.append({"type": "image"})
        converted.append({"role": message["role"], "content": parts})
    return converted, images


def data_url(image: Image.Image) -> str:
    """A PNG data URL, e.g. to send a video frame to a remote chat endpoint."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _image_bytes(url: str, param: str, max_bytes: int, remote_images: bool, allow_private: bool) -> bytes:
    if url.startswith("data:"):
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
