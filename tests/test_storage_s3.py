"""The Storage contract on LocalStorage and on S3Storage against a real S3 server (SeaweedFS,
the `s3_url` fixture), and what only S3 does: multipart uploads, server-side copies,
presigned URLs, and the API keeping a job's files in a bucket."""

from __future__ import annotations

import io
import uuid

import httpx
import numpy as np
import pytest
from boto3.s3.transfer import TransferConfig
from apps import app_client, idle_services
from PIL import Image
from stores import TEST_BUCKET
from pydantic import ValidationError

from vidserve import cli
from vidserve.config import Settings
from vidserve.errors import InvalidRequest
from vidserve.jobs import JobStatus, complete
from vidserve.media import encode_mp4
from vidserve.storage import LocalStorage, open_storage
from vidserve.storage.s3 import S3Storage, s3_client

MiB = 1024 * 1024
BUCKET = TEST_BUCKET


@pytest.fixture
def prefix() -> str:
    """This test's own part of the bucket, as a storage URL's prefix: `s3://BUCKET/PREFIX`."""
    return f"test-{uuid.uuid4().hex[:16]}/files"


def bucket_keys(s3_url: str, prefix: str) -> list[str]:
    page = s3_client(s3_url).list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")
    return sorted(item["Key"] for item in page.get("Contents", ()))


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        return LocalStorage(tmp_path / "files")
    s3_url, prefix = request.getfixturevalue("s3_url"), request.getfixturevalue("prefix")
    return S3Storage.from_url(f"s3://{BUCKET}/{prefix}", endpoint_url=s3_url)


def test_put_file_consumes_the_file_and_reads_back(storage, tmp_path):
    src = tmp_path / "out.mp4"
    src.write_bytes(b"mp4 data")
    assert storage.put_file("video_a/video.mp4", src) == "video_a/video.mp4"
    assert not src.exists()
    assert storage.read_bytes("video_a/video.mp4") == b"mp4 data"
    assert storage.size("video_a/video.mp4") == len(b"mp4 data")
    assert storage.exists("video_a/video.mp4") and not storage.exists("video_a/other.mp4")


def test_put_bytes_replaces_a_file(storage):
    assert storage.put_bytes("video_a/input.png", b"first") == "video_a/input.png"
    storage.put_bytes("video_a/input.png", b"second, longer")
    assert storage.read_bytes("video_a/input.png") == b"second, longer"
    assert storage.size("video_a/input.png") == len(b"second, longer")


def test_open_seeks_and_reads_ranges(storage):
    data = bytes(range(256)) * 1000
    storage.put_bytes("video_a/video.mp4", data)
    with storage.open("video_a/video.mp4") as file:
        assert file.seekable() and file.read(10) == data[:10] and file.tell() == 10
        assert file.read(20) == data[10:30]  # reading on continues where it was
        file.seek(100_000)
        assert file.read(5000) == data[100_000:105_000]
        file.seek(-100, io.SEEK_END)
        assert file.read() == data[-100:] and file.read(10) == b""
        file.seek(0)
        assert file.read() == data


def test_an_empty_file_opens_and_reads_empty(storage):
    storage.put_bytes("video_a/empty", b"")
    assert storage.size("video_a/empty") == 0
    with storage.open("video_a/empty") as file:
        assert file.read() == b""


def test_copy_leaves_the_source(storage):
    storage.put_bytes("video_a/input.png", b"png")
    assert storage.copy("video_a/input.png", "video_b/input.png") == "video_b/input.png"
    assert storage.read_bytes("video_b/input.png") == storage.read_bytes("video_a/input.png") == b"png"


def test_delete_prefix_removes_one_jobs_files_only(storage):
    for key in ["video_a/video.mp4", "video_a/thumbnail.webp", "video_ab/video.mp4", "video_c/video.mp4"]:
        storage.put_bytes(key, b"x")
    storage.delete_prefix("video_a/")
    assert not storage.exists("video_a/video.mp4") and not storage.exists("video_a/thumbnail.webp")
    assert storage.exists("video_ab/video.mp4")  # a job whose id starts with the other's is not touched
    storage.delete_prefix("video_ab")  # with or without the slash
    assert not storage.exists("video_ab/video.mp4") and storage.exists("video_c/video.mp4")
    storage.delete_prefix("video_gone/")  # nothing there: nothing to do


def test_a_missing_file_raises_file_not_found(storage):
    for read in (storage.open, storage.size, storage.read_bytes, lambda key: storage.copy(key, "video_b/x")):
        with pytest.raises(FileNotFoundError):
            read("video_a/missing.mp4")
    assert not storage.exists("video_b/x")


@pytest.mark.parametrize("key", ["", "../etc/passwd", "video_a/../../x", "/etc/passwd", "video_a\\video.mp4",
                                 ".", "video_a//video.mp4"])
def test_keys_that_could_leave_the_root_are_refused(storage, key):
    for use in (lambda: storage.put_bytes(key, b"x"), lambda: storage.read_bytes(key), lambda: storage.exists(key),
                lambda: storage.delete_prefix(key)):
        with pytest.raises(ValueError, match="invalid storage key"):
            use()


def test_local_storage_has_no_download_urls(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.put_bytes("video_a/video.mp4", b"x")
    assert storage.url("video_a/video.mp4", 60) is None


# --- S3 only ---------------------------------------------------------------------------------

def test_keys_live_under_the_urls_prefix(s3_url, prefix):
    storage = S3Storage.from_url(f"s3://{BUCKET}/{prefix}/", endpoint_url=s3_url)
    storage.put_bytes("video_a/video.mp4", b"x")
    assert bucket_keys(s3_url, prefix) == [f"{prefix}/video_a/video.mp4"]


def test_a_big_file_uploads_in_parts_and_copies_server_side(s3_url, prefix, tmp_path):
    storage = S3Storage.from_url(f"s3://{BUCKET}/{prefix}", endpoint_url=s3_url,
                                 transfer=TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB))
    calls: list[str] = []
    storage.client.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))
    data = np.random.default_rng(0).integers(0, 256, 12 * MiB, np.uint8).tobytes()
    src = tmp_path / "big.mp4"
    src.write_bytes(data)
    storage.put_file("video_a/video.mp4", src)
    assert calls.count("UploadPart") == 3 and "PutObject" not in calls and not src.exists()
    calls.clear()
    storage.put_bytes("video_c/source.mp4", data)  # an upload the API holds: in parts too
    assert calls.count("UploadPart") == 3 and "PutObject" not in calls
    assert storage.read_bytes("video_c/source.mp4") == data
    with storage.open("video_a/video.mp4") as file:
        file.seek(5 * MiB - 10)  # across the first part's end
        assert file.read(20) == data[5 * MiB - 10:5 * MiB + 10]
    calls.clear()
    storage.copy("video_a/video.mp4", "video_b/source.mp4")
    assert "UploadPart" not in calls and "PutObject" not in calls and "GetObject" not in calls
    assert storage.read_bytes("video_b/source.mp4") == data


def test_a_presigned_url_downloads_the_file(s3_url, prefix):
    storage = S3Storage.from_url(f"s3://{BUCKET}/{prefix}", endpoint_url=s3_url)  # idle_services takes the Storage
    storage.put_bytes("video_a/video.mp4", b"presigned bytes")
    response = httpx.get(storage.url("video_a/video.mp4", 60, filename="video_a.mp4"))
    assert response.status_code == 200 and response.content == b"presigned bytes"
    assert response.headers["content-disposition"] == 'attachment; filename="video_a.mp4"'
    assert response.headers["content-type"] == "video/mp4"


def test_settings_choose_the_storage(tmp_path):
    assert isinstance(open_storage(Settings(data_dir=tmp_path)), LocalStorage)
    s3 = open_storage(Settings(data_dir=tmp_path, storage="s3://videos/a/b", s3_endpoint_url="http://127.0.0.1:9"))
    assert isinstance(s3, S3Storage) and (s3.bucket, s3.prefix) == ("videos", "a/b/")
    for bad in ("s3://", "s3:///prefix", "gs://videos", "/var/files"):
        with pytest.raises(ValidationError):
            Settings(storage=bad)


@pytest.mark.parametrize("command", [["serve"], ["worker", "--model", "wan-tiny"]])
def test_the_storage_flag_sets_the_storage(command):
    args = cli.build_parser().parse_args([*command, "--storage", "s3://videos/prod"])
    assert cli._settings(args).storage == "s3://videos/prod"
    with pytest.raises(InvalidRequest, match="storage"):
        cli._settings(cli.build_parser().parse_args([*command, "--storage", "videos"]))


def png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_the_api_keeps_a_jobs_files_in_the_bucket(s3_url, prefix, tmp_path):
    storage = S3Storage.from_url(f"s3://{BUCKET}/{prefix}", endpoint_url=s3_url)  # idle_services takes the Storage
    with app_client(tmp_path, idle_services(tmp_path, storage=storage, s3_endpoint_url=s3_url)) as (client, services):
        created = client.post("/v1/videos", data={"model": "wan-tiny-i2v", "prompt": "x", "size": "64x64",
                                                  "num_frames": "5", "num_inference_steps": "1"},
                              files={"input_reference": ("a.png", png_bytes(), "image/png")})
        assert created.status_code == 200, created.text
        video_id = created.json()["id"]
        assert bucket_keys(s3_url, prefix) == [f"{prefix}/{video_id}/input.png"]

        # What a worker would store for it.
        frames = np.full((17, 64, 64, 3), 80, np.uint8)
        outputs = {"video": storage.put_file(f"{video_id}/video.mp4", encode_mp4(frames, tmp_path / "v.mp4", fps=16)),
                   "thumbnail": storage.put_bytes(f"{video_id}/thumbnail.webp", b"webp")}
        services.store.update(video_id, lambda job: setattr(job, "status", JobStatus.in_progress) or
                              setattr(job, "worker_id", "w"))
        services.store.update(video_id, complete("w", outputs, {}))
        video = storage.read_bytes(f"{video_id}/video.mp4")

        ranged = client.get(f"/v1/videos/{video_id}/content", headers={"Range": "bytes=10-99"})
        assert ranged.status_code == 206 and ranged.content == video[10:100]
        assert ranged.headers["content-range"] == f"bytes 10-99/{len(video)}"

        services.settings = services.settings.model_copy(update={"content_redirect": True, "content_url_seconds": 60})
        redirect = client.get(f"/v1/videos/{video_id}/content", follow_redirects=False)
        assert redirect.status_code == 307 and redirect.headers["cache-control"] == "no-store"
        assert httpx.get(redirect.headers["location"]).content == video
        thumbnail = client.get(f"/v1/videos/{video_id}/content", params={"variant": "thumbnail"},
                               follow_redirects=False)
        assert httpx.get(thumbnail.headers["location"]).content == b"webp"

        storage.delete_prefix(f"{video_id}/thumbnail.webp")
        gone = client.get(f"/v1/videos/{video_id}/content", params={"variant": "thumbnail"}, follow_redirects=False)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "content_missing"

        assert client.delete(f"/v1/videos/{video_id}").json()["deleted"] is True
        assert bucket_keys(s3_url, prefix) == []
