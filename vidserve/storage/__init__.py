"""Where job files (inputs, videos, thumbnails) live, addressed by keys like "video_abc/video.mp4".

Callers write, read, open, copy and delete through `Storage` (`base.py`) and never see where
a file is: `LocalStorage` (`local.py`) keeps files under a directory, `S3Storage` (`s3.py`) in
a bucket; `open_storage` picks one from the settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Storage, StorageUnavailable, check_key
from .local import LocalStorage

if TYPE_CHECKING:
    from vidserve.config import Settings

__all__ = ["LocalStorage", "Storage", "StorageUnavailable", "check_key", "open_storage"]


def open_storage(settings: Settings) -> Storage:
    """The storage `settings.storage` names: "local" (data_dir/files) or "s3://BUCKET[/PREFIX]"."""
    if settings.storage == "local":
        return LocalStorage(settings.data_dir / "files")
    from .s3 import S3Storage  # boto3 loads only where S3 is used

    return S3Storage.from_url(settings.storage, endpoint_url=settings.s3_endpoint_url)
