"""The trained shapes-world models: the committed weights load through the same
code as real checkpoints, and the training scripts run end to end. How well they follow
prompts is measured by benchmarks/shapes_eval.py (figures in benchmarks/RESULTS.md)."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from apps import app_client
from diffusers import WanTransformer3DModel
from PIL import Image
from safetensors.torch import load_file

from training import common, replay, shapes_world as world, train_wan
from training.shapes_score import score_caption
from training.vlm_shapes import build as build_vlm, pixel_values
from training.wan_shapes import build_transformer, deepen
from vidserve.config import Settings
from vidserve.pipelines.chain import generate_video
from vidserve.registry import WEIGHTS, resolve, spec_from_folder
from vidserve.options import GenerationOptions
from vidserve.video_request import build_request

ROOT = Path(__file__).resolve().parents[1]


def generate(prompt: str, seed: int, image=None) -> np.ndarray:
    request = build_request(resolve("wan-shapes"), Settings(), prompt, GenerationOptions(seed=seed), image=image)
    return generate_video(request, device="cpu", dtype="float32").frames


@pytest.fixture(scope="module")
def heldout():
    return world.sample_specs(8, 99, split="heldout", frames=17)


def test_committed_weights_are_small_safetensors():
    files = [p for p in WEIGHTS.rglob("*") if p.is_file()]
    weights = [p for p in files if p.suffix in (".safetensors", ".bin", ".pt", ".pth")]
    assert weights and all(p.suffix == ".safetensors" for p in weights)
    assert sum(p.stat().st_size for p in files) < 30 * 2**20
    assert (WEIGHTS / "wan-shapes" / "README.md").exists() and (WEIGHTS / "vlm-shapes" / "README.md").exists()


def test_the_folder_is_an_ordinary_ti2v_diffusers_checkpoint():
    spec = spec_from_folder(WEIGHTS / "wan-shapes")
    assert spec.kind == "ti2v" and spec.vae_stride == (4, 4, 4) and spec.patch_size == (1, 2, 2)
    assert spec.text_tokens == 24 and spec.frames_per_chunk == 17  # serving facts from vidserve.json's base


def test_image_to_video_opens_on_the_given_frame(heldout):
    for i, spec in enumerate(heldout[:3]):
        first = world.render(spec)[0]
        frames = generate(world.caption(spec), seed=i, image=Image.fromarray(first))
        assert frames.shape == (17, 64, 64, 3)
        # Wan2.2 TI2V keeps the given frame's latent clean: the clip opens on the VAE's copy of it.
        assert np.abs(frames[0].astype(int) - first).mean() < 12


def _data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_vlm_names_the_colours_and_shapes_of_held_out_frames(tmp_path):
    """Through POST /v1/chat/completions, on frames of (shape, colour, background) triples it never saw."""
    specs = [s for s in world.sample_specs(300, 99, frames=17) if world.is_frame_heldout(s) and len(s.objects) == 1]
    captions, colours, shapes = [], [], []
    with app_client(tmp_path, chat_model="vlm-shapes") as (client, _):

        def ask(image: Image.Image, question: str) -> str:
            reply = client.post("/v1/chat/completions", json={
                "model": "vlm-shapes", "max_tokens": 24, "temperature": 0, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": _data_url(image)}}]}]})
            assert reply.status_code == 200, reply.text
            return reply.json()["choices"][0]["message"]["content"]

        for spec in specs[:6]:
            image = Image.fromarray(world.render(spec)[8])
            truth = f"a {spec.colour} {spec.shape} on a {spec.background} background"
            captions.append(score_caption(ask(image, "Describe the image."), truth))
            colours.append(ask(image, f"What colour is the {spec.shape}?").strip() == spec.colour)
            shapes.append(ask(image, "What shape is it?").strip() == spec.shape)
    # The versions trained on named colours alone never named these triples' shapes (0 of 6)
    assert sum(c["colour+shape"] and c["background"] for c in captions) >= 5, captions
    assert sum(colours) >= 5 and sum(shapes) >= 5, (colours, shapes)


def _run(module: str, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_training_scripts_run_end_to_end(tmp_path):
    """A few steps of each script: they write folders that load and generate like the committed ones."""
    out = tmp_path / "wan"
    _run("training.train_vae", "--steps", "2", "--full-steps", "1", "1", "1", "--batches", "2", "1", "1", "1",
         "--workers", "1", "--out", str(out))
    _run("training.train_wan", "--steps", "2", "--batch", "2", "--clips", "8", "--workers", "1", "--out", str(out))
    spec = spec_from_folder(out)
    frames = generate_video(build_request(spec, Settings(), "a red circle moving left on a black background",
                                          GenerationOptions(seed=0, steps=2)), device="cpu", dtype="float32").frames
    assert frames.shape == (17, 64, 64, 3)
    # --resume starts from the saved transformer (at lr 0 it stays exactly that) and text encoder
    # (a new --seed draws new clips, not a new encoder), and keeps the log
    kept = ("transformer/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors")
    saved = {path: load_file(out / path) for path in kept}
    _run("training.train_wan", "--resume", "--seed", "1", "--steps", "1", "--lr", "0", "--batch", "2", "--clips", "8",
         "--object-weight", "5", "--mid-sigma", "0.5", "--image-share", "0.2", "--out", str(out))
    for path in kept:
        resumed = load_file(out / path)
        assert saved[path].keys() == resumed.keys(), path
        assert all(torch.equal(saved[path][k], resumed[k]) for k in resumed), path
    record = json.loads((out / "training" / "transformer.json").read_text())
    assert record["earlier_args"][0]["steps"] == 2 and {"resumed": 1} in record["log"]
    assert record["args"]["image_share"] == 0.2 and record["earlier_args"][0]["image_share"] == 0.5
    _run("training.train_wan", "--resume", "--deepen", "1", "--steps", "1", "--batch", "2", "--clips", "8",
         "--out", str(out))
    assert json.loads((out / "transformer" / "config.json").read_text())["num_layers"] == 5
    # A replay of those logs remakes the same weights (on the CPU, bit for bit)
    _run("training.replay", "--logs", str(out), "--out", str(tmp_path / "replayed"), "--device", "cpu")
    for path in ("vae/diffusion_pytorch_model.safetensors", *kept):
        made, remade = load_file(out / path), load_file(tmp_path / "replayed" / path)
        assert made.keys() == remade.keys() and all(torch.equal(made[k], remade[k]) for k in made), path
    _run("training.train_vlm", "--steps", "2", "--tower-steps", "2", "--batch", "4", "--frames", "40",
         "--out", str(tmp_path / "vlm"))
    assert (tmp_path / "vlm" / "model.safetensors").exists() and (tmp_path / "vlm" / "training.json").exists()


def test_shape_cells_follow_the_shape_through_the_latent_grid():
    """train_wan weighs the latent cells a shape touches: the first latent frame is frame 0 alone,
    each later one 4 frames; a cell is 4x4 pixels. The cell under the shape's centre is always set,
    cells well clear of the shape's path never are."""
    specs = world.sample_specs(6, 5, frames=17, two_shapes=0)
    clips, cells = train_wan.render(specs)
    assert clips.shape == (6, 17, 64, 64, 3) and cells.shape == (6, 5, 16, 16) and cells.dtype == bool
    ys, xs = np.mgrid[0:16, 0:16] * 4 + 2.0  # cell centres, px
    for spec, clip_cells in zip(specs, cells):
        shape = spec.objects[0]
        cx, cy = shape.centres(17)
        for latent, frames in enumerate([[0]] + [list(range(4 * k - 3, 4 * k + 1)) for k in range(1, 5)]):
            assert clip_cells[latent, int(cy[frames[-1]]) // 4, int(cx[frames[-1]]) // 4]
            near = np.min([np.hypot(xs - cx[f], ys - cy[f]) for f in frames], axis=0)
            assert not clip_cells[latent][near > shape.size * 1.5 + 4].any()
        assert 0.005 < clip_cells.mean() < 0.2


def test_replay_reads_every_run_and_where_a_deadline_stopped_it(tmp_path):
    """training.replay turns the logs into commands: each run's own arguments, --stop-at where
    its deadline stopped it (a later phase's stop at step 0 is the same stop), the VAE first."""
    logs = tmp_path / "model" / "training"
    logs.mkdir(parents=True)
    (logs / "vae.json").write_text(json.dumps({"args": {"seed": 0, "device": "cuda", "max_seconds": 60.0,
                                                        "batches": [2, 1, 1, 1], "decoder_only": False},
                                               "log": [{"step": 0}, {"stopped_early_at_step": 226},
                                                       {"stopped_early_at_step": 0}]}))
    resumed = {"seed": 9, "device": "cpu", "resume": True, "deepen": 0, "object_weight": 1.0, "max_seconds": 0}
    (logs / "transformer.json").write_text(json.dumps({
        "earlier_args": [{"seed": 0, "device": "cuda", "steps": 7000, "max_seconds": 225.0}], "args": resumed,
        "log": [{"step": 100}, {"stopped_early_at_step": 6688}, {"resumed": 1}, {"step": 100}]}))
    out = tmp_path / "again"
    made = [c[2:] for c in replay.commands(tmp_path / "model", out, None)]
    assert made == [
        ["training.train_vae", "--seed", "0", "--batches", "2", "1", "1", "1", "--out", str(out), "--device", "cuda",
         "--stop-at", "226"],
        ["training.train_wan", "--seed", "0", "--steps", "7000", "--out", str(out), "--device", "cuda",
         "--stop-at", "6688"],
        ["training.train_wan", "--seed", "9", "--resume", "--deepen", "0", "--object-weight", "1.0",
         "--out", str(out), "--device", "cpu"]]


def test_training_pixels_are_what_the_served_processor_makes():
    """train_vlm normalises frames itself; the engine serves through the processor: the same numbers."""
    _, processor = build_vlm(0)
    frames = np.stack([world.render(s)[5] for s in world.sample_specs(4, 3, frames=17)])
    served = processor.image_processor(images=[Image.fromarray(f) for f in frames], return_tensors="pt")
    torch.testing.assert_close(pixel_values(processor, frames), served["pixel_values"], atol=1e-5, rtol=0)


def test_prefetch_keeps_order_with_workers():
    assert list(common.prefetch(abs, range(-9, 0), workers=2)) == list(range(9, 0, -1))


def test_deepened_transformer_computes_what_it_did_and_its_new_blocks_learn(tmp_path):
    """train_wan --deepen grows a trained transformer: the output is unchanged, the folder saves
    and loads with the new depth, and the new blocks' zeroed projections get gradients."""
    model = build_transformer(3).eval()
    latents, timestep, text = torch.randn(1, 8, 5, 16, 16), torch.full((1, 320), 600.0), torch.randn(1, 24, 64)
    with torch.no_grad():
        before = model(latents, timestep, text, return_dict=False)[0]
        deep = deepen(model, 2)
        after = deep(latents, timestep, text, return_dict=False)[0]
    assert len(deep.blocks) == 6 and before.abs().mean() > 0.1
    with pytest.raises(ValueError, match="0 to 6 blocks"):
        deepen(deep, 7)
    torch.testing.assert_close(after, before, atol=0, rtol=0)
    deep.save_pretrained(tmp_path)
    loaded = WanTransformer3DModel.from_pretrained(tmp_path).eval()
    assert loaded.config.num_layers == 6
    with torch.no_grad():
        torch.testing.assert_close(loaded(latents, timestep, text, return_dict=False)[0], before)
    added = [loaded.blocks[3], loaded.blocks[5]]  # copies of blocks 2 and 3, each placed after its original
    assert all(not block.ffn.net[-1].weight.any() for block in added)
    loaded(latents, timestep, text, return_dict=False)[0].square().mean().backward()
    for block in added:
        assert block.ffn.net[-1].weight.grad.abs().sum() > 0 and block.attn1.to_out[0].weight.grad.abs().sum() > 0
