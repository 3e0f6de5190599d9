"""deploy/: the images build, and the compose fleet works as one service. Through the openai SDK
against each API replica, a job made on one is downloaded from the other; a worker killed mid-job
comes back (restart: unless-stopped) and its job completes; a killed Redis loses nothing; the
images run as a user of their own. One fleet serves every test here; it is torn down at the end.

It runs where podman works (CI: .ci/run installs podman, runc and mmdebstrap), and skips in one
line elsewhere."""

from __future__ import annotations

import os
import subprocess

import pytest
from openai import OpenAI

import containers
from containers import IMAGES, Fleet
from polling import eventually
from servers import free_port

# Building the images from nothing takes minutes; the tests after it, a few more.
pytestmark = [pytest.mark.timeout(1200), pytest.mark.first,
              pytest.mark.filterwarnings("ignore:The Sora API is scheduled:DeprecationWarning")]

PROMPT = "a red circle moving right on a white background"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("deploy")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in containers.engine_settings(workdir).items():
            patch.setenv(name, value)
        yield from fleet_in(workdir)


def fleet_in(workdir):
    if (problem := containers.engine_problem()) is not None:
        pytest.skip(f"no container engine: {problem}")
    base, sources = containers.base_image(), containers.package_sources()
    containers.build_images(base, sources, workdir)
    env_file = workdir / "fleet.env"
    secrets = subprocess.run(["sh", str(containers.ROOT / "deploy" / "new-env.sh")], capture_output=True, text=True,
                             check=True).stdout
    # The API replicas without a chat model never load torch, and start in seconds; a lease of
    # 15 s hands a dead worker's job on sooner than the default 30 s.
    env_file.write_text(secrets + "VIDSERVE_CHAT_MODEL=\nVIDSERVE_LEASE_SECONDS=15\n")
    api_key = next(line.split("=", 1)[1] for line in secrets.splitlines() if line.startswith("VIDSERVE_API_KEYS="))
    fleet = Fleet(f"vidserve-test-{os.getpid()}", env_file, (free_port(), free_port()), api_key)
    try:
        fleet.up()
        for url in fleet.urls:
            eventually(lambda: ready(url), timeout=300, interval=1, what=f"the API at {url} to be ready")
        yield fleet
    finally:
        fleet.down()
    assert not fleet.containers(), "the fleet left containers behind"


def ready(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError as exc:
        raise AssertionError(f"{url}/readyz: {exc}") from exc


def client(fleet: Fleet, replica: int) -> OpenAI:
    return OpenAI(base_url=f"{fleet.urls[replica]}/v1", api_key=fleet.api_key, max_retries=0)


def create(fleet: Fleet, replica: int, steps: int):
    """A job on one replica, once a worker holds the model (until then: 503 model_unavailable)."""
    import openai

    def created():
        try:
            return client(fleet, replica).videos.create(
                prompt=PROMPT, extra_body={"num_inference_steps": steps, "seed": 7})
        except openai.APIStatusError as exc:
            if exc.status_code != 503:
                raise
            raise AssertionError(f"not yet: {exc}") from exc

    return eventually(created, timeout=300, interval=1, what="a worker to take wan-shapes jobs")


def finished(fleet: Fleet, replica: int, video_id: str, timeout: float = 300):
    def done():
        video = client(fleet, replica).videos.retrieve(video_id)
        assert video.status in ("completed", "failed"), f"{video.status}, {video.progress}%"
        return video

    return eventually(done, timeout=timeout, interval=0.5, what=f"{video_id} to finish")


def downloaded(fleet: Fleet, replica: int, video_id: str) -> bytes:
    return client(fleet, replica).videos.download_content(video_id, variant="video").read()


@pytest.fixture(scope="module")
def first_video(fleet):
    video = create(fleet, 0, steps=2)
    assert finished(fleet, 1, video.id).status == "completed"
    return video


def test_a_job_made_on_one_replica_downloads_from_the_other(fleet, first_video):
    mp4 = downloaded(fleet, 1, first_video.id)
    assert mp4[4:8] == b"ftyp" and mp4 == downloaded(fleet, 0, first_video.id)
    assert client(fleet, 0).videos.retrieve(first_video.id).model == "wan-shapes"


def test_the_images_run_as_their_own_user_know_their_version_and_hold_the_models(fleet):
    for service in ("api-1", "api-2", "worker-wan-shapes"):
        uid = containers.podman("exec", fleet.container(service), "id", "-u").stdout.strip()
        assert uid == "10001", f"{service} runs as uid {uid}"
    for image, user in ((IMAGES["redis"], "redis"), (IMAGES["seaweedfs"], "seaweedfs")):
        assert containers.podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip() == user
    version = containers.podman("run", "--rm", "--network", "none", IMAGES["cpu"], "--version")
    assert version.stdout.strip() == "vidserve 0.1.0"
    # `IMAGE serve` with nothing else set: the embedded server, on the shapes models inside the image.
    check = containers.podman("run", "--rm", "--network", "none", IMAGES["cpu"], "check").stdout
    assert "ok   model wan-shapes: local folder /opt/vidserve/" in check, check
    assert "ok   storage: /var/lib/vidserve/files is readable and writable" in check, check


def test_every_service_passes_its_health_check(fleet):
    def passes(service: str) -> bool:
        assert fleet.healthy(service), f"its log:\n{fleet.logs(service)}"
        return True

    for service in ("redis", "s3", "api-1", "api-2", "worker-wan-shapes"):
        eventually(lambda: passes(service), timeout=120, interval=2, what=f"{service}'s health check to pass")


def test_a_killed_worker_and_a_killed_redis_lose_no_job(fleet, first_video):
    worker, redis = fleet.state("worker-wan-shapes"), fleet.state("redis")
    running = create(fleet, 1, steps=20)
    eventually(lambda: client(fleet, 0).videos.retrieve(running.id).progress > 0, timeout=300, interval=0.1,
               what="the job to be under way")
    containers.crash(worker)  # mid-job: its second attempt below says the first one died
    waiting = create(fleet, 0, steps=2)  # acknowledged while no worker runs
    containers.crash(redis)

    for service, before in (("redis", redis), ("worker-wan-shapes", worker)):
        eventually(lambda: fleet.state(service)["RestartCount"] > before["RestartCount"], timeout=60,
                   interval=0.5, what=f"{service} to restart")
    survivor = finished(fleet, 0, running.id, timeout=420)
    assert survivor.status == "completed" and survivor.attempts == 2, survivor
    assert finished(fleet, 1, waiting.id).status == "completed"
    for replica in (0, 1):
        listed = {video.id for video in client(fleet, replica).videos.list(limit=100)}
        assert {first_video.id, running.id, waiting.id} <= listed
        assert downloaded(fleet, replica, running.id)[4:8] == b"ftyp"
    assert downloaded(fleet, 1, first_video.id)[4:8] == b"ftyp"
