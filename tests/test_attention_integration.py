"""Top-k sparse attention inside the Wan pipelines: where it is installed, and that its
limits reproduce dense attention exactly."""

import numpy as np
import pytest
import torch
from diffusers import WanPipeline
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from vidserve.config import Settings
from vidserve.pipelines.attention import SparseAttention, SparseSelfAttnProcessor
from vidserve.pipelines.tiny import build_tiny_pipeline
from vidserve.pipelines.video import VideoPipeline, get_pipeline
from vidserve.registry import resolve
from vidserve.options import GenerationOptions
from vidserve.video_request import build_request


def frames(pipeline, attention, size="128x128", num_frames=33, steps=3, model="wan-tiny"):
    request = build_request(resolve(model), Settings(), "a red fox",
                            GenerationOptions(steps=steps, seed=3, attention=attention), size=size,
                            num_frames=num_frames)
    return pipeline.generate(request).frames


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


@pytest.fixture(scope="module")
def t2v():
    return get_pipeline(resolve("wan-tiny"), "cpu", "float32")


def test_density_one_reproduces_the_dense_video(t2v):
    dense = frames(t2v, {"mode": "dense"})
    assert np.array_equal(frames(t2v, {"mode": "topk", "min_tokens": 0, "density": 1.0}), dense)


def test_topk_changes_the_video_a_little_and_dense_steps_undo_it(t2v):
    dense = frames(t2v, {"mode": "dense"})
    topk = {"mode": "topk", "min_tokens": 0, "density": 0.125, "tile": [2, 2, 2]}  # sparse at any size
    sparse = frames(t2v, topk)
    assert not np.array_equal(sparse, dense)
    assert psnr(sparse, dense) > 30
    all_dense_steps = frames(t2v, {**topk, "dense_steps": 3})
    assert np.array_equal(all_dense_steps, dense)
    all_dense_layers = frames(t2v, {**topk, "dense_layers": 2})
    assert np.array_equal(all_dense_layers, dense)


def test_too_few_tokens_run_dense_and_the_result_says_so(t2v):
    def run(attention):  # 33 frames at 128x128: a 9x8x8 grid, 576 tokens
        request = build_request(resolve("wan-tiny"), Settings(), "a red fox",
                                GenerationOptions(steps=3, seed=3, attention=attention), size="128x128",
                                num_frames=33)
        return t2v.generate(request)

    dense, auto = run({"mode": "dense"}), run({"mode": "topk", "density": 0.125, "tile": [2, 2, 2]})
    assert (dense.attention, auto.attention) == ("dense", "dense")
    assert np.array_equal(auto.frames, dense.frames)
    forced = run({"mode": "topk", "density": 0.125, "tile": [2, 2, 2], "min_tokens": 576})
    assert forced.attention == "sparse" and not np.array_equal(forced.frames, dense.frames)


def test_only_self_attention_is_made_sparse_and_dense_restores_diffusers(t2v):
    frames(t2v, {"mode": "topk", "min_tokens": 0}, num_frames=5, steps=1)
    blocks = t2v.text_pipe.transformer.blocks
    assert all(isinstance(b.attn1.processor, SparseSelfAttnProcessor) for b in blocks)
    assert all(isinstance(b.attn2.processor, WanAttnProcessor) for b in blocks)
    frames(t2v, {"mode": "dense"}, num_frames=5, steps=1)
    assert all(isinstance(b.attn1.processor, WanAttnProcessor) for b in blocks)


def test_image_to_video_keeps_its_image_cross_attention():
    pipeline = get_pipeline(resolve("wan-tiny-i2v"), "cpu", "float32")
    image = __import__("PIL.Image").Image.new("RGB", (64, 64), (200, 40, 40))
    request = build_request(resolve("wan-tiny-i2v"), Settings(), "a fox",
                            GenerationOptions(steps=2, seed=1,
                                              attention={"mode": "topk", "min_tokens": 0, "density": 1.0}),
                            size="64x64", num_frames=9, image=image)
    sparse = pipeline.generate(request).frames
    dense = pipeline.generate(build_request(resolve("wan-tiny-i2v"), Settings(), "a fox",
                                            GenerationOptions(steps=2, seed=1), size="64x64", num_frames=9,
                                            image=image)).frames
    assert np.array_equal(sparse, dense)


def test_both_experts_of_a_two_expert_model_get_sparse_attention():
    tiny = build_tiny_pipeline(resolve("wan-tiny"))
    torch.manual_seed(1)
    second = type(tiny.transformer)(**tiny.transformer.config).eval()
    two_experts = WanPipeline(tokenizer=tiny.tokenizer, text_encoder=tiny.text_encoder, vae=tiny.vae,
                              scheduler=tiny.scheduler, transformer=tiny.transformer, transformer_2=second,
                              boundary_ratio=0.5)
    pipeline = VideoPipeline(resolve("wan-tiny"), two_experts, torch.device("cpu"))
    assert isinstance(pipeline.attention, SparseAttention) and len(pipeline.attention.transformers) == 2
    frames(pipeline, {"mode": "topk", "min_tokens": 0}, size="64x64", num_frames=9, steps=2)
    for transformer in (tiny.transformer, second):
        assert all(isinstance(b.attn1.processor, SparseSelfAttnProcessor) for b in transformer.blocks)
    assert pipeline.attention.state.grid == (3, 4, 4)  # (9-1)/4+1 latent frames, 64/8/2 tokens a side
