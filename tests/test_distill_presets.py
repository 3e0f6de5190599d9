"""The Wan2.1 14B `distill-4step` presets apply lightx2v's published LoRAs: a file of the published
name in a lora dir registers under the preset's adapter name; `vidserve models` lists each preset's
files and whether they are here; `vidserve check --preset` names a missing one and the command
that fetches it, in one line; a request for the preset without its file is a 400 naming the file,
before anything is queued. No network and no real weights: the adapter files are a few bytes
(nothing loads them), and the hub cache holds an empty snapshot where a model must look present."""

from __future__ import annotations

import pytest
from apps import app_client, idle_services
from huggingface_hub import constants
from PIL import Image

from vidserve import cli
from vidserve.config import Settings
from vidserve.errors import InvalidRequest
from vidserve.loras import PUBLIC_ADAPTERS, LoraRegistry, LoraRequest
from vidserve.options import GenerationOptions
from vidserve.registry import MODELS
from vidserve.video_request import build_request

T2V_FILE = "Wan21_T2V_14B_lightx2v_cfg_step_distill_lora_rank64.safetensors"
I2V_FILE = "Wan21_I2V_14B_lightx2v_cfg_step_distill_lora_rank64.safetensors"
T2V_URL = ("https://huggingface.co/lightx2v/Wan2.1-T2V-14B-StepDistill-CfgDistill-Lightx2v/resolve/main/loras/"
           + T2V_FILE)
DISTILLED = GenerationOptions(preset="distill-4step")
SMALL = {"size": "832x480", "num_frames": 17}


@pytest.fixture
def lora_dir(tmp_path):
    folder = tmp_path / "loras"
    folder.mkdir()
    return folder


def downloaded(folder, name: str = T2V_FILE):
    """A stand-in for the published file: registering an adapter reads no weights."""
    path = folder / name
    path.write_bytes(b"not weights")
    return path


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty hub cache for this test; `cached(repo)` puts an empty snapshot of `repo` in it,
    which is all the check that a model's weights are here reads."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))

    def cached(repo: str) -> None:
        folder, commit = cache / f"models--{repo.replace('/', '--')}", "0" * 40
        (folder / "snapshots" / commit).mkdir(parents=True)
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(commit)

    return cached


def test_the_presets_name_the_published_files():
    t2v, i2v = MODELS["Wan2.1-T2V-14B"].preset("distill-4step"), MODELS["Wan2.1-I2V-14B-480P"].preset("distill-4step")
    assert (t2v.steps, t2v.guidance, t2v.flow_shift) == (4, 1.0, 5.0)
    assert t2v.loras == (LoraRequest(name="lightx2v-t2v-14b"),)
    assert i2v.loras == (LoraRequest(name="lightx2v-i2v-14b-480p"),)
    published = {name: (a.repo, a.path) for name, a in PUBLIC_ADAPTERS.items()}
    assert published == {
        "lightx2v-t2v-14b": ("lightx2v/Wan2.1-T2V-14B-StepDistill-CfgDistill-Lightx2v", f"loras/{T2V_FILE}"),
        "lightx2v-i2v-14b-480p": ("lightx2v/Wan2.1-I2V-14B-480P-StepDistill-CfgDistill-Lightx2v", f"loras/{I2V_FILE}"),
    }
    assert T2V_FILE in t2v.description and I2V_FILE in i2v.description


def test_a_published_file_in_a_lora_dir_registers_under_the_presets_name(lora_dir):
    t2v, i2v = downloaded(lora_dir), downloaded(lora_dir, I2V_FILE)
    downloaded(lora_dir, "my-style.safetensors")
    adapters = LoraRegistry.from_settings(str(lora_dir), "")
    assert (adapters.get("lightx2v-t2v-14b").path, adapters.get("lightx2v-i2v-14b-480p").path) == (t2v, i2v)
    assert adapters.get("my-style") is not None  # any other file keeps its stem
    request = build_request(MODELS["Wan2.1-T2V-14B"], Settings(), "a fox", DISTILLED, adapters=adapters, **SMALL)
    assert request.loras == (LoraRequest(name="lightx2v-t2v-14b"),)
    assert (request.steps, request.guidance, request.flow_shift) == (4, 1.0, 5.0)


def test_a_preset_without_its_file_is_refused_naming_the_file_and_its_source():
    with pytest.raises(InvalidRequest) as refused:
        build_request(MODELS["Wan2.1-T2V-14B"], Settings(), "a fox", DISTILLED, adapters=LoraRegistry([]), **SMALL)
    assert (refused.value.param, refused.value.code) == ("preset", "adapter_missing")
    assert refused.value.message == (
        f"preset 'distill-4step': adapter 'lightx2v-t2v-14b' needs {T2V_FILE}, which is in no lora dir "
        f"(VIDSERVE_LORA_DIRS); fetch it with `curl -L --create-dirs -o LORA_DIR/{T2V_FILE} {T2V_URL}`")


def test_an_adapter_published_nowhere_is_refused_the_same_way_saying_how_to_register_it():
    with pytest.raises(InvalidRequest) as refused:
        build_request(MODELS["Wan2.1-I2V-14B-720P"], Settings(), "a fox", DISTILLED, image=Image.new("RGB", (832, 480)),
                      adapters=LoraRegistry([]), **SMALL)
    assert (refused.value.param, refused.value.code) == ("preset", "adapter_missing")
    assert refused.value.message == ("preset 'distill-4step': adapter 'lightx2v-i2v-14b-720p' is not registered; "
                                     "register its file with --lora lightx2v-i2v-14b-720p=PATH")


def test_a_request_naming_its_own_adapters_does_not_need_the_presets():
    request = build_request(MODELS["Wan2.1-T2V-14B"], Settings(), "a fox",
                            GenerationOptions(preset="distill-4step", loras=[]), adapters=LoraRegistry([]), **SMALL)
    assert (request.loras, request.steps) == ((), 4)


def preset_rows(output: str) -> dict[tuple[str, str, str], list[str]]:
    """`vidserve models`' second table: (model, preset, adapter) -> [here, file]."""
    table = output.split("\n\n")[1].splitlines()
    assert table[0].split() == ["model", "preset", "adapter", "here", "file"]
    return {tuple(cells[:3]): [cells[3], " ".join(cells[4:])] for cells in map(str.split, table[1:])}


def test_models_lists_each_presets_files_and_whether_they_are_here(lora_dir, capsys):
    assert cli.main(["models", "--lora-dir", str(lora_dir)]) == 0
    rows = preset_rows(capsys.readouterr().out)
    assert rows[("Wan2.1-T2V-14B", "distill-4step", "lightx2v-t2v-14b")] == [
        "no", f"{T2V_FILE} from lightx2v/Wan2.1-T2V-14B-StepDistill-CfgDistill-Lightx2v"]
    assert rows[("Wan2.1-I2V-14B-480P", "distill-4step", "lightx2v-i2v-14b-480p")] == [
        "no", f"{I2V_FILE} from lightx2v/Wan2.1-I2V-14B-480P-StepDistill-CfgDistill-Lightx2v"]
    assert rows[("Wan2.2-T2V-A14B", "distill-4step", "lightning-t2v-a14b-low")] == [
        "no", "register it: --lora lightning-t2v-a14b-low=PATH"]

    path = downloaded(lora_dir)
    assert cli.main(["models", "--lora-dir", str(lora_dir)]) == 0
    assert preset_rows(capsys.readouterr().out)[("Wan2.1-T2V-14B", "distill-4step", "lightx2v-t2v-14b")] == [
        "yes", str(path)]


def check(capsys, *args: str) -> tuple[int, dict[str, str]]:
    """`vidserve check`'s exit status, and each line by its check's name."""
    status = cli.main(["check", "--device", "cpu", *args])
    lines = capsys.readouterr().out.strip().splitlines()
    return status, {line.split(maxsplit=1)[1].split(":")[0]: line for line in lines}


def test_check_names_a_missing_file_and_the_command_that_fetches_it_then_passes(hub, lora_dir, tmp_path, capsys):
    hub("Wan-AI/Wan2.1-T2V-14B-Diffusers")  # the model's weights are here: only the adapter is missing
    args = ["--data-dir", str(tmp_path / "data"), "--model", "Wan2.1-T2V-14B", "--preset", "distill-4step",
            "--lora-dir", str(lora_dir)]
    status, lines = check(capsys, *args)
    assert status == 1
    assert lines["preset Wan2.1-T2V-14B distill-4step"] == (
        f"FAIL preset Wan2.1-T2V-14B distill-4step: adapter 'lightx2v-t2v-14b' needs {T2V_FILE}, which is in no "
        f"lora dir (VIDSERVE_LORA_DIRS); fetch it with `curl -L --create-dirs -o {lora_dir}/{T2V_FILE} {T2V_URL}`")
    assert [name for name, line in lines.items() if not line.startswith("ok   ")] == [
        "preset Wan2.1-T2V-14B distill-4step"]

    path = downloaded(lora_dir)
    status, lines = check(capsys, *args)
    assert status == 0, lines
    assert lines["preset Wan2.1-T2V-14B distill-4step"] == (
        f"ok   preset Wan2.1-T2V-14B distill-4step: lightx2v-t2v-14b is {path}")


def test_check_without_a_lora_dir_suggests_one(hub, tmp_path, capsys):
    hub("Wan-AI/Wan2.1-I2V-14B-480P-Diffusers")
    status, lines = check(capsys, "--data-dir", str(tmp_path / "data"), "--model", "Wan2.1-I2V-14B-480P",
                          "--preset", "distill-4step")
    assert status == 1
    assert lines["preset Wan2.1-I2V-14B-480P distill-4step"].endswith(
        f"`curl -L --create-dirs -o loras/{I2V_FILE} https://huggingface.co/lightx2v/"
        f"Wan2.1-I2V-14B-480P-StepDistill-CfgDistill-Lightx2v/resolve/main/loras/{I2V_FILE}`, and register the "
        "folder: --lora-dir loras")


def test_generate_refuses_the_preset_without_its_file_in_one_line(lora_dir, capsys):
    status = cli.main(["generate", "a fox", "--model", "Wan2.1-T2V-14B", "--preset", "distill-4step",
                       "--device", "cpu", "--lora-dir", str(lora_dir), "-q"])
    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        f"vidserve: error: preset 'distill-4step': adapter 'lightx2v-t2v-14b' needs {T2V_FILE}, which is in no lora "
        f"dir (VIDSERVE_LORA_DIRS); fetch it with `curl -L --create-dirs -o LORA_DIR/{T2V_FILE} {T2V_URL}`"]


def test_the_api_refuses_the_preset_without_its_file_and_queues_nothing(hub, lora_dir, tmp_path):
    """On an embedded server, where a job runs only for a model whose weights are here: a model
    that cannot run is refused for that first; once its weights are here, for the adapter's file."""
    services = idle_services(tmp_path, lora_dirs=str(lora_dir))
    body = {"model": "Wan2.1-T2V-14B", "prompt": "a fox", "preset": "distill-4step", **SMALL}
    with app_client(tmp_path, services) as (client, _):
        assert client.post("/v1/videos", json=body).json()["error"]["code"] == "model_unavailable"
        hub("Wan-AI/Wan2.1-T2V-14B-Diffusers")
        response = client.post("/v1/videos", json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["param"], error["code"], error["type"]) == ("preset", "adapter_missing", "invalid_request_error")
        assert T2V_FILE in error["message"] and T2V_URL in error["message"]
        assert services.queue.submitted == [] and client.get("/v1/videos").json()["data"] == []


def test_the_api_takes_the_preset_once_its_file_is_in_a_lora_dir(hub, lora_dir, tmp_path):
    hub("Wan-AI/Wan2.1-T2V-14B-Diffusers")
    downloaded(lora_dir)
    services = idle_services(tmp_path, lora_dirs=str(lora_dir))
    body = {"model": "Wan2.1-T2V-14B", "prompt": "a fox", "preset": "distill-4step", **SMALL}
    with app_client(tmp_path, services) as (client, _):
        response = client.post("/v1/videos", json=body)
        assert response.status_code == 200, response.text
        assert services.queue.submitted == [response.json()["id"]]
        job = services.store.get(response.json()["id"])
    assert [lora.name for lora in job.params.loras] == ["lightx2v-t2v-14b"]
    assert (job.params.steps, job.params.guidance) == (4, 1.0)
