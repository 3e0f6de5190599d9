"""`S3Storage`: job files as objects in an S3 bucket (AWS, or any S3-compatible server),
so the API and workers on other machines share them with no shared filesystem.

Credentials and region come from boto3's usual chain (`AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_DEFAULT_REGION`, `~/.aws`, instance roles).
"""

from __future__ import annotations

import io
import mimetypes
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError, HTTPClientError, IncompleteReadError
from botocore.exceptions import ConnectionError as BotoConnectionError

from vidserve.media.formats import FORMATS

from .base import Storage, StorageUnavailable, check_key

MiB = 1024 * 1024
# `mimetypes` does not know .webp or .apng on every Python this runs on.
_CONTENT_TYPES = {".mp4": "video/mp4", ".webp": "image/webp", ".png": "image/png", ".jpg": "image/jpeg",
                  **{f.extension: f.media_type for f in FORMATS.values()}}
_MISSING = {"404", "NoSuchKey", "NotFound"}
# A server error or overload, not a problem with the request: the same call may work in a moment.
_OUTAGE_CODES = {"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown"}
_OUTAGE_STATUSES = {500, 502, 503, 504}


def parse_s3_url(url: str) -> tuple[str, str]:
    """("BUCKET", "PREFIX/") of "s3://BUCKET/PREFIX" ("" without a prefix)."""
    if not url.startswith("s3://"):
        raise ValueError(f"an S3 storage URL looks like s3://BUCKET[/PREFIX], not {url!r}")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in storage URL {url!r}")
    prefix = prefix.strip("/")
    return bucket, check_key(prefix) + "/" if prefix else ""


def s3_client(endpoint_url: str | None = None) -> Any:
    config = Config(
        # SigV4 everywhere, presigned URLs too: botocore may presign with the retired SigV2,
        # which newer AWS regions refuse and S3-compatible servers verify unevenly.
        signature_version="s3v4",
        # Path-style requests (endpoint/bucket/key): S3-compatible servers rarely have a DNS
        # name per bucket, which virtual-hosted requests (bucket.endpoint/key) need.
        s3={"addressing_style": "path" if endpoint_url else "auto"},
        # Checksums only where S3 requires them: the CRC headers boto3 adds by default are
        # refused by several S3-compatible servers.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        # Give up on a dead server within seconds, not boto3's minute: the caller's own retry
        # loop (vidserve/jobs/outages.py) is what waits out an outage. A busy server can take a few
        # seconds to answer a large part; a dead one never answers.
        connect_timeout=3,
        read_timeout=10,
        retries={"mode": "standard", "max_attempts": 3},
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


def _is_missing(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in _MISSING


def _is_outage(exc: ClientError) -> bool:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status in _OUTAGE_STATUSES or exc.response.get("Error", {}).get("Code") in _OUTAGE_CODES


@contextmanager
def _s3_errors(location: str, missing_key: str | None = None) -> Iterator[None]:
    """boto3's errors as the Storage contract's: an unreachable or failing server is
    StorageUnavailable; with `missing_key`, a missing object is FileNotFoundError."""
    try:
        yield
    except S3UploadFailedError as exc:
        # upload_file wraps the ClientError it caught (as the exception's context) in this.
        cause = exc.__context__
        if isinstance(cause, ClientError) and _is_outage(cause):
            raise StorageUnavailable(f"storage {location} is unavailable: {cause}") from exc
        raise
    except ClientError as exc:
        if missing_key is not None and _is_missing(exc):
            raise FileNotFoundError(f"no stored file {missing_key!r}") from None
        if _is_outage(exc):
            raise StorageUnavailable(f"storage {location} is unavailable: {exc}") from exc
        raise
    except (BotoConnectionError, HTTPClientError, IncompleteReadError) as exc:  # refused, reset, timed out, cut
        raise StorageUnavailable(f"storage {location} is unavailable: {exc}") from exc


class S3Storage(Storage):
    def __init__(self, client: Any, bucket: str, prefix: str = "", transfer: TransferConfig | None = None):
        # boto3's transfer defaults: multipart from 8 MiB on, in 8 MiB parts, several in flight.
        self.client, self.bucket, self.prefix = client, bucket, prefix
        self.location = f"s3://{bucket}/{prefix}"
        self.transfer = transfer or TransferConfig()

    @classmethod
    def from_url(cls, url: str, endpoint_url: str | None = None, **kwargs) -> S3Storage:
        bucket, prefix = parse_s3_url(url)
        return cls(s3_client(endpoint_url), bucket, prefix, **kwargs)

    def _object(self, key: str) -> str:
        return self.prefix + check_key(key)

    @staticmethod
    def _type(key: str) -> dict[str, str]:
        suffix = Path(key).suffix.lower()
        content_type = _CONTENT_TYPES.get(suffix) or mimetypes.guess_type(key)[0]
        return {"ContentType": content_type} if content_type else {}

    def put_file(self, key: str, src_path: str | Path) -> str:
        # upload_file goes multipart past the transfer's threshold; either way the object
        # appears whole when the upload completes, never partly written.
        with _s3_errors(self.location):
            self.client.upload_file(os.fspath(src_path), self.bucket, self._object(key),
                                    ExtraArgs=self._type(key), Config=self.transfer)
        os.unlink(src_path)  # consumed, as LocalStorage's move does
        return key

    def put_bytes(self, key: str, data: bytes) -> str:
        with _s3_errors(self.location):  # multipart past the transfer's threshold, as put_file
            self.client.upload_fileobj(io.BytesIO(data), self.bucket, self._object(key),
                                       ExtraArgs=self._type(key), Config=self.transfer)
        return key

    def _head(self, key: str) -> dict:
        with _s3_errors(self.location, missing_key=key):
            return self.client.head_object(Bucket=self.bucket, Key=self._object(key))

    def open(self, key: str) -> BinaryIO:
        head = self._head(key)
        return S3ObjectReader(self.client, self.bucket, self._object(key), head["ContentLength"], head["ETag"],
                              self.location)

    def size(self, key: str) -> int:
        return self._head(key)["ContentLength"]

    def exists(self, key: str) -> bool:
        try:
            self._head(key)
        except FileNotFoundError:
            return False
        return True

    def read_bytes(self, key: str) -> bytes:
        with _s3_errors(self.location, missing_key=key):
            return self.client.get_object(Bucket=self.bucket, Key=self._object(key))["Body"].read()

    def copy(self, src_key: str, dest_key: str) -> str:
        # Server-side: the bytes never pass through this process (multipart past the threshold).
        source = {"Bucket": self.bucket, "Key": self._object(src_key)}
        with _s3_errors(self.location, missing_key=src_key):
            self.client.copy(source, self.bucket, self._object(dest_key), Config=self.transfer)
        return dest_key

    def delete_prefix(self, prefix: str) -> None:
        # As in LocalStorage, a prefix is a folder ("video_abc" or "video_abc/") or one file:
        # never the raw string prefix that would also catch "video_abcd".
        name = self._object(prefix.rstrip("/"))
        with _s3_errors(self.location):
            keys = [name]
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                               Prefix=name + "/"):
                keys.extend(item["Key"] for item in page.get("Contents", ()))
            for start in range(0, len(keys), 1000):  # the most one DeleteObjects takes
                batch = [{"Key": k} for k in keys[start:start + 1000]]
                answer = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
                if answer.get("Errors"):
                    failed = ", ".join(f"{e['Key']} ({e.get('Code')})" for e in answer["Errors"])
                    raise OSError(f"could not delete {failed}")

    def url(self, key: str, seconds: int, filename: str | None = None) -> str | None:
        params = {"Bucket": self.bucket, "Key": self._object(key)}
        if filename is not None:
            params["ResponseContentDisposition"] = f'attachment; filename="{filename}"'
        return self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=seconds)


class S3ObjectReader(io.RawIOBase):
    """A seekable read-only file over one object: each read continues one ranged GET from
    the current position, and a seek starts a new one, so serving a byte range fetches
    only that range."""

    def __init__(self, client: Any, bucket: str, name: str, size: int, etag: str, location: str):
        super().__init__()
        self.client, self.bucket, self.name, self.size, self.etag = client, bucket, name, size, etag
        self.location = location  # the storage's, for StorageUnavailable
        self._position = 0
        self._body = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        if base + offset != self._position:
            self._drop_body()
            self._position = base + offset
        return self._position

    def readinto(self, buffer) -> int:
        if self._position >= self.size:
            return 0
        with _s3_errors(self.location):
            if self._body is None:
                # IfMatch: a file replaced meanwhile fails the read instead of mixing two versions.
                self._body = self.client.get_object(Bucket=self.bucket, Key=self.name, IfMatch=self.etag,
                                                    Range=f"bytes={self._position}-")["Body"]
            data = self._body.read(len(buffer))
        if not data:
            raise OSError(f"{self.name}: the object ended at byte {self._position} of {self.size}")
        buffer[:len(data)] = data
        self._position += len(data)
        return len(data)

    def readall(self) -> bytes:
        parts = []
        while chunk := self.read(8 * MiB):
            parts.append(chunk)
        return b"".join(parts)

    def _drop_body(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None

    def close(self) -> None:
        self._drop_body()
        super().close()
