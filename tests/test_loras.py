"""LoRA adapters per request, on wan-tiny with random adapters built here: the same adapter in
diffusers', Kohya/musubi's and the original Wan (lightx2v) layout gives the same frames;
interleaved requests on one pipeline each give exactly what they give alone on a fresh one;
a corrupt file fails its job alone; the API validates adapters and presets before queueing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from apps import app_client, idle_services
from openai import BadRequestError, OpenAI
from lora_files import TINY, as_musubi, as_original, random_lora

from vidserve.config import Settings
from vidserve.errors import InvalidRequest
from vidserve.jobs import Job, JobStatus
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.loras import LOADED_ADAPTERS, LoraRegistry, read_adapter
from vidserve.params import JobParams
from vidserve.pipelines.video import VideoPipeline
from vidserve.registry import MODELS, spec_from_folder
from vidserve.options import GenerationOptions
from vidserve.video_request import build_request
from vidserve.storage import LocalStorage
from vidserve.workers.runner import JobRunner

@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Random adapters for wan-tiny in one folder, as a server's --lora-dir; "style" and "other"
    registered here, "unused" only through the folder."""
    root = tmp_path_factory.mktemp("loras")
    for name in ("style", "other", "unused"):
        (root / name).mkdir()
    style, other = random_lora(root / "style", seed=1), random_lora(root / "other", seed=2)
    random_lora(root / "unused", seed=3)
    return LoraRegistry([read_adapter("style", style), read_adapter("other", other)]), root


def fresh_pipeline() -> VideoPipeline:
    return VideoPipeline.load(TINY, torch.device("cpu"), torch.float32)


def frames(pipeline: VideoPipeline, registry: LoraRegistry, loras=None, seed: int = 3) -> np.ndarray:
    request = build_request(TINY, Settings(), "a fox", GenerationOptions(steps=2, seed=seed, loras=loras),
                            num_frames=9, adapters=registry)
    return pipeline.generate(request, adapters=registry).frames


def test_kohya_original_and_diffusers_layouts_of_one_adapter_give_the_same_frames(adapters, tmp_path):
    registry, root = adapters
    diffusers_file = registry.get("style").path
    layouts = LoraRegistry([read_adapter("diffusers", diffusers_file),
                            read_adapter("kohya", as_musubi(diffusers_file, tmp_path / "kohya.safetensors")),
                            read_adapter("original", as_original(diffusers_file, tmp_path / "original.safetensors"))])
    pipeline = fresh_pipeline()
    base = frames(pipeline, layouts)
    by_layout = {name: frames(pipeline, layouts, [{"name": name}]) for name in ("diffusers", "kohya", "original")}
    assert not np.array_equal(by_layout["diffusers"], base)  # the adapter does something
    assert np.array_equal(by_layout["kohya"], by_layout["diffusers"])
    assert np.array_equal(by_layout["original"], by_layout["diffusers"])


def test_interleaved_requests_each_give_what_they_give_alone(adapters):
    registry, _ = adapters
    sequence = [None, [{"name": "style"}], None, [{"name": "style", "scale": 0.5}],
                [{"name": "style"}, {"name": "other", "scale": 0.7}]]
    worker = fresh_pipeline()
    interleaved = [frames(worker, registry, loras) for loras in sequence]
    alone = [frames(fresh_pipeline(), registry, loras) for loras in sequence]
    for i, (a, b) in enumerate(zip(interleaved, alone)):
        assert np.array_equal(a, b), f"request {i} ({sequence[i]}) differs from its run alone"
    assert np.array_equal(interleaved[0], interleaved[2])  # base after an adapter is exactly base
    distinct = {interleaved[i].tobytes() for i in (0, 1, 3, 4)}  # base, the adapter, at 0.5, with another
    assert len(distinct) == 4
    assert worker.adapters.loaded == ["style", "other"]


def test_the_cache_keeps_the_most_recently_used_adapters(adapters):
    registry, _ = adapters
    small = LoraRegistry(list(registry.adapters.values()), cache_size=1)
    pipeline = fresh_pipeline()

    def request(adapter: str):
        return build_request(TINY, Settings(), "a fox", GenerationOptions(steps=1, seed=0, loras=[{"name": adapter}]),
                             num_frames=5, adapters=small)

    first = pipeline.generate(request("style"), adapters=small).loras
    again = pipeline.generate(request("style"), adapters=small).loras
    assert [(e.name, e.cached) for e in first + again] == [("style", False), ("style", True)]
    pipeline.generate(request("other"), adapters=small)
    assert pipeline.adapters.loaded == ["other"]  # "style" was dropped to make room


def test_a_pipeline_that_ran_adapters_saves_the_base_model(adapters, tmp_path):
    registry, _ = adapters
    worker = fresh_pipeline()
    with_style = frames(worker, registry, [{"name": "style"}])
    worker.save(str(tmp_path / "saved"))
    saved = VideoPipeline.load(spec_from_folder(tmp_path / "saved"), torch.device("cpu"), torch.float32)
    assert np.array_equal(frames(saved, registry), frames(fresh_pipeline(), registry))
    assert worker.adapters.loaded == []
    assert np.array_equal(frames(worker, registry, [{"name": "style"}]), with_style)  # it loads again


def test_a_corrupt_adapter_fails_its_job_alone(adapters, tmp_path):
    registry, root = adapters
    corrupt = tmp_path / "broken.safetensors"
    corrupt.write_bytes(b"\x00not a safetensors file")
    settings = Settings(data_dir=tmp_path / "data", loras=f"broken={corrupt},style={registry.get('style').path}")
    store = SQLiteJobStore(tmp_path / "jobs.sqlite")
    runner = JobRunner(settings, store, LocalStorage(tmp_path / "files"), worker_id="w1")
    jobs = []
    for loras in ([{"name": "broken"}], [{"name": "style"}], None):
        request = build_request(TINY, settings, "a fox", GenerationOptions(steps=1, seed=0, loras=loras),
                                num_frames=5, adapters=runner.adapters)
        job, _ = store.create(Job(model=TINY.name, prompt="a fox", params=JobParams.of(request, "0.25")))
        jobs.append(runner.run(job.id))
    assert jobs[0].status is JobStatus.failed and jobs[0].error.code == "lora_load_failed"
    assert "broken" in jobs[0].error.message
    assert [job.status for job in jobs[1:]] == [JobStatus.completed, JobStatus.completed]
    text = runner.metrics.registry.get_sample_value("vidserve_lora_loads_total", {"model": "wan-tiny",
                                                                                   "adapter": "style"})
    assert text == 1
    store.close()


@pytest.fixture
def api(adapters, tmp_path):
    registry, root = adapters
    with app_client(tmp_path, idle_services(tmp_path, lora_dirs=str(root), max_loras=2)) as (client, services):
        yield client, services


BODY = {"model": "wan-tiny", "prompt": "a fox", "seconds": "1", "size": "64x64"}


def test_the_api_lists_adapters_and_records_a_requests(api):
    client, services = api
    listed = {a["id"]: a for a in client.get("/v1/loras").json()["data"]}
    assert {"style", "other"} <= set(listed)
    assert listed["style"]["size_bytes"] > 0 and listed["style"]["base_models"] == []
    # This process runs the embedded queue's jobs, so it knows what is loaded: what earlier tests
    # here loaded, and never the adapter nothing used.
    assert listed["style"]["loaded"] == ("style" in LOADED_ADAPTERS.names()) and listed["unused"]["loaded"] is False
    video = client.post("/v1/videos", json={**BODY, "loras": [{"name": "style", "scale": 0.8}]}).json()
    assert video["loras"] == [{"name": "style", "scale": 0.8, "target": "both"}]
    form = client.post("/v1/videos", data={**BODY, "loras": '[{"name": "other"}]'}).json()
    assert form["loras"] == [{"name": "other", "scale": 1.0, "target": "both"}]


def test_the_openai_sdk_sends_adapters_in_extra_body(api):
    client, services = api
    sdk = OpenAI(base_url=f"{client.base_url}/v1", api_key="unused", http_client=client)
    video = sdk.videos.create(prompt="a fox", model="wan-tiny", seconds="1", size="64x64",
                              extra_body={"loras": [{"name": "style", "scale": 0.5}]})
    assert video.model_extra["loras"] == [{"name": "style", "scale": 0.5, "target": "both"}]
    assert services.store.get(video.id).params.loras[0].name == "style"
    with pytest.raises(BadRequestError) as refused:
        sdk.videos.create(prompt="a fox", model="wan-tiny", extra_body={"loras": [{"name": "nope"}]})
    assert refused.value.param.startswith("loras") and "unknown adapter" in refused.value.message, refused.value.body


@pytest.mark.parametrize("loras, says", [
    ([{"name": "nope"}], "unknown adapter 'nope'"),
    ([{"name": "style"}, {"name": "other"}, {"name": "style"}], "at most 2"),
    ([{"name": "style"}, {"name": "style"}], "named once"),
    ([{"name": "style", "scale": 9}], "less than or equal to 2"),
    ([{"name": "style", "target": "middle"}], "'both', 'high' or 'low'"),
])
def test_bad_adapters_are_refused_before_queueing(api, loras, says):
    client, services = api
    response = client.post("/v1/videos", json={**BODY, "loras": loras})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith("loras") and says in error["message"], error
    assert services.store.list()[0] == []


def test_an_adapter_for_another_model_is_refused(api, tmp_path):
    client, services = api
    (tmp_path / "shapes-only.json").write_text('{"base_model": "wan-shapes"}')
    (tmp_path / "shapes-only.safetensors").write_bytes(b"")
    services.adapters.adapters["shapes-only"] = read_adapter("shapes-only", tmp_path / "shapes-only.safetensors")
    response = client.post("/v1/videos", json={**BODY, "loras": [{"name": "shapes-only"}]})
    assert response.status_code == 400 and "is for wan-shapes, not wan-tiny" in response.json()["error"]["message"]


def test_a_preset_fills_what_the_request_leaves_unset(api):
    client, _ = api
    video = client.post("/v1/videos", json={**BODY, "preset": "fast"}).json()
    assert (video["num_inference_steps"], video["guidance_scale"], video["preset"]) == (2, 1.0, "fast")
    video = client.post("/v1/videos", json={**BODY, "preset": "fast", "num_inference_steps": 3}).json()
    assert video["num_inference_steps"] == 3
    unknown = client.post("/v1/videos", json={**BODY, "preset": "slow"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "preset"
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert [p["name"] for p in models["wan-tiny"]["presets"]] == ["fast"]
    assert models["Wan2.2-T2V-A14B"]["presets"][0]["loras"][0]["target"] == "high"


def test_a_preset_whose_adapter_is_not_registered_says_what_it_needs():
    with pytest.raises(InvalidRequest) as refused:
        build_request(MODELS["Wan2.1-T2V-14B"], Settings(), "a fox", GenerationOptions(preset="distill-4step"),
                      adapters=LoraRegistry([]))
    assert refused.value.param == "preset" and "adapter 'lightx2v-t2v-14b' needs" in refused.value.message


def test_a_preset_shift_changes_the_frames_and_leaves_the_scheduler_as_it_was(adapters):
    registry, _ = adapters
    pipeline = fresh_pipeline()
    shift = pipeline.text_pipe.scheduler.config.flow_shift
    plain = build_request(TINY, Settings(), "a fox", GenerationOptions(steps=2, guidance=1.0, seed=0), num_frames=5)
    preset = build_request(TINY, Settings(), "a fox", GenerationOptions(preset="fast", seed=0), num_frames=5)
    assert (preset.steps, preset.guidance, preset.flow_shift) == (2, 1.0, 2.0)
    a, b = pipeline.generate(plain).frames, pipeline.generate(preset).frames
    assert not np.array_equal(a, b)
    assert pipeline.text_pipe.scheduler.config.flow_shift == shift
    assert np.array_equal(pipeline.generate(plain).frames, a)


def test_registration_errors_are_one_line(tmp_path):
    with pytest.raises(Exception, match="no such folder"):
        LoraRegistry.from_settings(str(tmp_path / "missing"), "")
    with pytest.raises(Exception, match="NAME=PATH"):
        LoraRegistry.from_settings("", "just-a-name")
