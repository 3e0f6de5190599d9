"""wan-shapes' `fast` preset: 4 steps without guidance through the bundled step-distilled
adapter `wan-shapes-4step`, which `training/distill.py` makes. Its adherence against the
default is measured in benchmarks/shapes_eval.py (the `fast` section); here, what it is made of."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from apps import app_client, idle_services

from vidserve.config import Settings
from vidserve.loras import LoraRegistry, LoraRequest
from vidserve.options import GenerationOptions
from vidserve.pipelines.chain import generate_video
from vidserve.pipelines.video import get_pipeline
from vidserve.registry import resolve
from vidserve.video_request import build_request

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red circle moving right on a white background"


def test_the_preset_is_listed_and_its_adapter_is_bundled(tmp_path):
    with app_client(tmp_path, idle_services(tmp_path)) as (client, _):
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        presets = {p["name"]: p for p in models["wan-shapes"]["presets"]}
        loras = {a["id"]: a for a in client.get("/v1/loras").json()["data"]}
    fast = presets["fast"]
    assert (fast["num_inference_steps"], fast["guidance_scale"], fast["flow_shift"]) == (4, 1.0, 2.0)
    assert fast["loras"] == [{"name": "wan-shapes-4step", "scale": 1.0, "target": "both"}]
    adapter = loras["wan-shapes-4step"]
    assert adapter["base_models"] == ["wan-shapes"] and adapter["recommended_preset"] == "fast"
    assert 0 < adapter["size_bytes"] < 4 * 2**20


def calls_and_frames(request, adapters) -> tuple[int, np.ndarray]:
    """How many times the transformer ran for `request`, and the frames it made."""
    transformer = get_pipeline(resolve("wan-shapes"), "cpu", "float32").text_pipe.transformer
    calls = []
    hook = transformer.register_forward_hook(lambda *_: calls.append(1))
    try:
        frames = generate_video(request, "cpu", "float32", adapters=adapters).frames
    finally:
        hook.remove()
    return len(calls), frames


def test_fast_is_one_transformer_call_a_step_through_the_adapter():
    adapters = LoraRegistry.from_settings("", "")
    spec, settings = resolve("wan-shapes"), Settings(chat_model="")
    fast = build_request(spec, settings, PROMPT, GenerationOptions(preset="fast", seed=3), adapters=adapters)
    assert (fast.steps, fast.guidance, fast.flow_shift) == (4, 1.0, 2.0)
    assert fast.loras == (LoraRequest(name="wan-shapes-4step"),)
    calls, distilled = calls_and_frames(fast, adapters)
    assert calls == 4  # guidance 1: the pipeline makes no unconditional pass
    plain = build_request(spec, settings, PROMPT, GenerationOptions(steps=4, guidance=1.0, seed=3), adapters=adapters)
    calls, undistilled = calls_and_frames(plain.model_copy(update={"flow_shift": 2.0}), adapters)
    assert calls == 4 and not np.array_equal(distilled, undistilled)  # the adapter is what differs
    default = build_request(spec, settings, PROMPT, GenerationOptions(seed=3), adapters=adapters)
    assert calls_and_frames(default, adapters)[0] == 40  # 20 guided steps: two calls each


def test_the_distillation_script_runs_end_to_end(tmp_path):
    """A few pairs and steps: the folder it writes registers as an adapter and loads."""
    out = tmp_path / "wan-shapes-4step-test"
    done = subprocess.run([sys.executable, "-m", "training.distill", "--pairs", "4", "--teacher-batch", "4",
                           "--steps", "2", "--batch", "2", "--eval-prompts", "2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    log = json.loads((out / "training" / "distill.json").read_text())
    assert {"student", "teacher", "plain"} <= log.keys() and log["args"]["pairs"] == 4
    adapters = LoraRegistry.from_settings(str(tmp_path), "")
    assert adapters.get(out.name).recommended_preset == "fast"
    request = build_request(resolve("wan-shapes"), Settings(chat_model=""), PROMPT,
                            GenerationOptions(steps=1, guidance=1.0, seed=0, loras=[{"name": out.name}]),
                            adapters=adapters)
    assert generate_video(request, "cpu", "float32", adapters=adapters).frames.shape == (17, 64, 64, 3)
