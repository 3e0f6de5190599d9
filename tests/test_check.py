"""`vidserve check` on a real topology: Redis, S3 storage (SeaweedFS), a model, the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from stores import TEST_BUCKET, RedisServer


@pytest.fixture
def topology(redis_url, seaweedfs, s3_url, tmp_path):
    """`vidserve check` arguments and environment for a Celery deployment on the session's
    Redis (append-only file on) and S3 storage under a prefix of this test's own."""
    prefix = f"check-{uuid.uuid4().hex}"
    args = ["--queue", "celery", "--redis-url", redis_url, "--storage", f"s3://{TEST_BUCKET}/{prefix}",
            "--data-dir", str(tmp_path / "data"), "--model", "wan-tiny", "--device", "cpu"]
    return args, {**os.environ, "VIDSERVE_S3_ENDPOINT_URL": s3_url}, prefix


def check(args: list[str], env: dict[str, str]) -> tuple[int, dict[str, str]]:
    """Exit status, and each line's name -> the line."""
    result = subprocess.run([sys.executable, "-m", "vidserve.cli", "check", *args], capture_output=True, text=True,
                            env=env, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stdout.strip().splitlines()
    return result.returncode, {line.split(maxsplit=1)[1].split(":")[0]: line for line in lines}


def replaced(args: list[str], flag: str, value: str) -> list[str]:
    i = args.index(flag)
    return [*args[:i + 1], value, *args[i + 2:]]


def test_a_working_topology_passes(topology, seaweedfs):
    args, env, prefix = topology
    status, lines = check(args, env)
    assert status == 0, lines
    assert list(lines) == ["redis", "storage", "model wan-tiny", "device"]  # the default model is wan-tiny too
    assert all(line.startswith("ok   ") for line in lines.values()), lines
    assert "writes its append-only file" in lines["redis"]
    assert lines["device"].startswith("ok   device: cpu, float32")
    assert seaweedfs.keys(prefix) == []  # the storage probe cleans up after itself


def test_a_redis_without_its_append_only_file_fails(topology, tmp_path):
    args, env, _ = topology
    redis = RedisServer(tmp_path, appendonly=False).start()
    try:
        status, lines = check(replaced(args, "--redis-url", redis.url), env)
    finally:
        redis.stop()
    assert status == 1
    assert lines["redis"].startswith(f"FAIL redis: Redis at {redis.url} runs without its append-only file"), lines
    assert "CONFIG SET appendonly yes" in lines["redis"]
    assert all(line.startswith("ok   ") for name, line in lines.items() if name != "redis"), lines


def test_a_missing_bucket_fails_naming_it(topology):
    args, env, _ = topology
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    status, lines = check(replaced(args, "--storage", f"s3://{bucket}/videos"), env)
    assert status == 1
    assert lines["storage"] == (f"FAIL storage: s3://{bucket}/videos/: bucket {bucket!r} does not exist: create "
                                "it, or name an existing one in --storage"), lines
    assert all(line.startswith("ok   ") for name, line in lines.items() if name != "storage"), lines
