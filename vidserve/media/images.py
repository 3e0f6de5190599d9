"""User images in: data URLs as JSON bodies carry them, and safe opening of what a user sends
(unreadable or oversized images refused before any pixel is decoded)."""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from pathlib import Path
from typing import BinaryIO

from PIL import Image, ImageOps, UnidentifiedImageError

from vidserve.errors import InvalidRequest


def decode_data_url(url: str, param: str, max_bytes: int) -> bytes:
    """The bytes of a `data:<type>;base64,<payload>` URL, as JSON bodies carry images."""
    header, _, payload = url.partition(",")
    if not header.startswith("data:") or not header.endswith(";base64") or not payload:
        raise InvalidRequest(f"{param} must be a data URL like data:image/png;base64,<data>", param=param)
    if len(payload) * 3 // 4 > max_bytes:
        raise InvalidRequest(f"{param} is larger than the {max_bytes}-byte limit", param=param,
                             code="file_too_large")
    try:
        return base64.b64decode(payload, validate=True)
    except binascii.Error:
        raise InvalidRequest(f"{param} is not valid base64", param=param) from None


def load_image(source: str | Path | bytes | BinaryIO, max_pixels: int) -> Image.Image:
    """Open a user-supplied image as RGB, refusing anything unreadable or too large."""
    if isinstance(source, (str, Path)):
        name, fp = repr(str(source)), source
    elif isinstance(source, (bytes, bytearray, memoryview)):
        name, fp = "from the request", io.BytesIO(source)
    else:
        name, fp = repr(getattr(source, "name", "from the upload")), source

    def invalid(reason: str) -> InvalidRequest:
        return InvalidRequest(f"could not read image {name}: {reason}", param="image")

    try:
        with warnings.catch_warnings():
            # Pillow only warns between 1x and 2x its bomb limit; treat both the same.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(fp) as img:
                # Image.open reads only the header, so this check runs before any pixels are decoded.
                pixels = img.width * img.height
                if pixels > max_pixels:
                    raise InvalidRequest(
                        f"image is {img.width}x{img.height} = {pixels} pixels; the limit is {max_pixels}",
                        param="image",
                    )
                # Phone photos are often stored sideways with an EXIF rotation flag.
                return ImageOps.exif_transpose(img).convert("RGB")
    except InvalidRequest:
        raise
    except FileNotFoundError:
        raise invalid("no such file") from None
    except UnidentifiedImageError:
        raise invalid("not a PNG, JPEG, WebP or other image Pillow can decode") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise invalid(f"larger than Pillow's decompression-bomb limit of {Image.MAX_IMAGE_PIXELS} pixels") from None
    except Exception as exc:  # Pillow's decoders raise OSError, SyntaxError, ValueError, EOFError, ...
        raise invalid(f"the file is corrupt or truncated ({exc})") from None
