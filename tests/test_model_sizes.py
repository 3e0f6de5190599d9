"""What each model can make: a size past its position table is a 400 at submission naming `size`
and the model's range; one far from the sizes it was trained at is made, with a warning on the
video object from the start; `/v1/models` gives the range; the CLI refuses a bad size before it
imports torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from apps import app_client, idle_services
from diffusers import WanTransformer3DModel

from vidserve.registry import MODELS, WEIGHTS, spec_from_folder

SHAPES = MODELS["wan-shapes"]


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sizes")
    with app_client(tmp_path, idle_services(tmp_path)) as (client, services):
        yield client, services


def video(size: str) -> dict:
    return {"model": "wan-shapes", "prompt": "a red circle moving left on a black background", "size": size,
            "num_inference_steps": 1}


@pytest.mark.parametrize("size", ["1280x720", "528x64"])
def test_a_size_past_the_position_table_is_refused_at_submission(api, size):
    client, services = api
    before = len(services.store.list()[0])
    response = client.post("/v1/videos", json=video(size))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "size" and error["type"] == "invalid_request_error"
    assert f"size {size} is larger than wan-shapes can make" in error["message"]
    assert "multiples of 16, from 16 to 512" in error["message"] and "trained at 64x64" in error["message"]
    assert len(services.store.list()[0]) == before  # never queued to fail in the worker


def test_a_size_far_from_training_is_queued_with_a_warning(api):
    client, _ = api
    far = client.post("/v1/videos", json=video("128x128"))
    assert far.status_code == 200, far.text
    warned = size_warnings(far.json())
    assert [w["chunk"] for w in warned] == [None] and "trained at 64x64" in warned[0]["message"]
    assert size_warnings(client.get(f"/v1/videos/{far.json()['id']}").json()) == warned
    for near in ("64x64", "80x64"):
        response = client.post("/v1/videos", json=video(near))
        assert response.status_code == 200 and size_warnings(response.json()) == [], response.text


def size_warnings(video: dict) -> list[dict]:
    return [w for w in video["warnings"] if w["code"] == "untrained_size"]


def test_models_list_the_sizes_each_can_make(api):
    client, services = api
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert models["wan-shapes"]["sizes"] == {"multiple": 16, "max_side": 512, "trained": ["64x64"]}
    # The server's own limit is lower than what the Wan models' tables cover.
    assert models["Wan2.2-TI2V-5B"]["sizes"] == {"multiple": 32, "max_side": services.settings.max_side,
                                                 "trained": ["1280x704", "704x1280"]}
    assert models["wan-tiny"]["sizes"]["trained"] == []  # random weights: noise at any size, so no warning


def test_the_registry_range_is_the_models_own():
    """The bundled weights' position table is what the registry says, and the largest size it
    allows runs through it while the next one up fails, as it did in the worker."""
    folder = WEIGHTS / "wan-shapes"
    assert spec_from_folder(folder).max_side == SHAPES.max_side == 512
    rope = WanTransformer3DModel.from_pretrained(folder / "transformer").rope
    stride = SHAPES.vae_stride[1]
    latents = lambda width: torch.zeros(1, 8, 5, 64 // stride, width // stride)  # noqa: E731
    rope(latents(SHAPES.max_side))
    with pytest.raises(RuntimeError, match="is invalid"):
        rope(latents(SHAPES.max_side + SHAPES.size_multiple))


# Runs the CLI in a fresh interpreter and reports which heavy libraries the refusal imported.
REFUSE = ("import sys\nfrom vidserve import cli\ncode = cli.main(sys.argv[1:])\n"
          "print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))\nsys.exit(code)")


@pytest.mark.parametrize("args", [["--size", "100x100"], ["--model", "wan-shapes", "--size", "1280x720"],
                                  ["--frames", "30"], ["--steps", "0"], ["--seconds", "100000"]])
def test_the_cli_refuses_a_bad_argument_before_importing_torch(tmp_path, args):
    out = tmp_path / "x.mp4"
    result = subprocess.run([sys.executable, "-c", REFUSE, "generate", "a red circle", "-o", str(out), *args],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vidserve: error: "), result.stderr
    assert result.stdout.strip() == "[]", "imported before refusing: " + result.stdout
    assert not out.exists()
