"""Renditions are job files like the MP4 and the thumbnail: stored through the Storage
interface (a directory, or an S3 bucket on a real S3 server) with their media types, served
from there, and deleted with the video or when it expires."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
from apps import app_client, idle_services
from stores import TEST_BUCKET

from vidserve.api.services import Services
from vidserve.jobs import Job, JobStatus
from vidserve.media.drift import Anchor, measure
from vidserve.params import JobParams
from vidserve.pipelines import chain
from vidserve.media.renditions import OutputRequest, resolve_outputs
from vidserve.storage.s3 import S3Storage, s3_client
from vidserve.workers.runner import JobRunner

OUTPUTS = [OutputRequest(format="webm", fps=8, fps_mode="blend"), OutputRequest(format="frames"),
           OutputRequest(format="gif")]


@pytest.fixture(params=["local", "s3"])
def services(request, tmp_path):
    if request.param == "local":
        return idle_services(tmp_path)
    # Opened here, not named in settings: idle_services' `storage` takes the Storage itself.
    url, endpoint = f"s3://{TEST_BUCKET}/test-{uuid.uuid4().hex[:16]}/files", request.getfixturevalue("s3_url")
    return idle_services(tmp_path, storage=S3Storage.from_url(url, endpoint_url=endpoint), s3_endpoint_url=endpoint,
                         content_redirect=True)


def stored(services: Services, video_id: str) -> list[str]:
    """The video's files, looked up where the storage keeps them (not through it)."""
    location = services.storage.location  # a folder, or s3://BUCKET/PREFIX/
    if not location.startswith("s3://"):
        folder = Path(location) / video_id
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []
    prefix = location.split("/", 3)[3] + f"{video_id}/"
    page = s3_client(services.settings.s3_endpoint_url).list_objects_v2(Bucket=TEST_BUCKET, Prefix=prefix)
    return sorted(item["Key"][len(prefix):] for item in page.get("Contents", ()))


def test_renditions_are_stored_served_and_expired_with_the_video(services, monkeypatch, tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, (9, 48, 64, 3), dtype=np.uint8)

    def made(request, *args, on_chunk, **kwargs):  # two chunks, handed over as the chain hands them
        for index, part in enumerate((frames[:5], frames[5:])):
            on_chunk(index, part, measure(part, Anchor.from_frames(frames[:5])), request.prompt)
        return chain.VideoResult(frames=frames, fps=request.fps, seed=request.seed)

    monkeypatch.setattr(chain, "generate_video", made)
    settings, storage = services.settings, services.storage
    params = JobParams(width=64, height=48, num_frames=9, fps=16, steps=1, guidance=1.0, seed=3, chunk_frames=(5, 5),
                       seconds="0.5", outputs=resolve_outputs(OUTPUTS, 64, 48, 16, 9, settings))
    job, _ = services.store.create(Job(model="wan-tiny", prompt="a fox", params=params))
    done = JobRunner(settings, services.store, storage, worker_id="w").run(job.id)
    assert done.status is JobStatus.completed, done.error
    assert stored(services, job.id) == ["chunk-0.mp4", "chunk-1.mp4", "outputs/frames.zip", "outputs/gif.gif",
                                        "outputs/webm.webm", "spritesheet.jpg", "stream/0.m4s", "stream/1.m4s",
                                        "stream/init.mp4", "thumbnail.webp", "video.mp4"]

    with app_client(tmp_path, services) as (client, _):
        for name, media_type in (("webm", "video/webm"), ("frames", "application/zip"), ("gif", "image/gif"),
                                 ("spritesheet", "image/jpeg")):
            response = client.get(f"/v1/videos/{job.id}/content", params={"variant": name}, follow_redirects=False)
            if settings.content_redirect:  # S3: the presigned URL serves the object with its own type
                assert response.status_code == 307, response.text
                response = httpx.get(response.headers["location"])
            assert response.status_code == 200 and response.headers["content-type"] == media_type, name
            assert response.content == storage.read_bytes(done.outputs[name]), name

        assert services.sweeper.sweep(now=done.completed_at + settings.output_ttl + 1) == [job.id]
        assert stored(services, job.id) == []
        assert client.get(f"/v1/videos/{job.id}/content", params={"variant": "webm"}).status_code == 410
