"""The video pipeline on the built-in tiny Wan models: shapes, seeds, images, progress, export."""

import numpy as np
import pytest
import torch
from PIL import Image

from vidserve.config import Settings
from vidserve.errors import JobCancelled
from vidserve.pipelines.video import VideoPipeline, get_pipeline
from vidserve.registry import resolve, spec_from_folder
from vidserve.options import GenerationOptions
from vidserve.video_request import build_request

SETTINGS = Settings()


def request(model, prompt="a red fox in snow", image=None, **options):
    return build_request(resolve(model), SETTINGS, prompt, GenerationOptions(**{"steps": 2, "seed": 7, **options}),
                         size="64x64", num_frames=9, image=image)


def gradient_image(color):
    ramp = np.linspace(0, 1, 64)[None, :, None]
    return Image.fromarray((ramp * np.array(color)[None, None, :] * np.ones((64, 1, 1))).astype(np.uint8))


@pytest.fixture(scope="module")
def t2v():
    return get_pipeline(resolve("wan-tiny"), "cpu", "float32")


def test_text_to_video_shape_and_determinism(t2v):
    first = t2v.generate(request("wan-tiny"))
    again = t2v.generate(request("wan-tiny"))
    other = t2v.generate(request("wan-tiny", seed=8))
    assert first.frames.shape == (9, 64, 64, 3) and first.frames.dtype == np.uint8
    assert np.array_equal(first.frames, again.frames)
    assert not np.array_equal(first.frames, other.frames)
    assert set(first.timings) == {"denoise", "decode"}


def test_prompt_changes_the_video(t2v):
    a = t2v.generate(request("wan-tiny", prompt="a red fox"))
    b = t2v.generate(request("wan-tiny", prompt="a blue whale"))
    assert not np.array_equal(a.frames, b.frames)


def test_pipelines_are_loaded_once(t2v):
    assert get_pipeline(resolve("wan-tiny"), "cpu", "float32") is t2v


def test_step_callback_reports_every_step_and_can_cancel(t2v):
    seen = []
    t2v.generate(request("wan-tiny", steps=3), on_step=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 3), (2, 3), (3, 3)]

    calls = []

    def cancel_after_first(done, total):
        calls.append(done)
        raise JobCancelled()

    with pytest.raises(JobCancelled):
        t2v.generate(request("wan-tiny", steps=3), on_step=cancel_after_first)
    assert calls == [1]


def test_image_to_video_is_conditioned_on_the_image():
    pipe = get_pipeline(resolve("wan-tiny-i2v"), "cpu", "float32")
    red = pipe.generate(request("wan-tiny-i2v", image=gradient_image((255, 0, 0))))
    blue = pipe.generate(request("wan-tiny-i2v", image=gradient_image((0, 0, 255))))
    assert red.frames.shape == (9, 64, 64, 3)
    assert not np.array_equal(red.frames, blue.frames)


def test_ti2v_runs_with_and_without_an_image():
    pipe = get_pipeline(resolve("wan-tiny-ti2v"), "cpu", "float32")
    text_only = pipe.generate(request("wan-tiny-ti2v"))
    red = pipe.generate(request("wan-tiny-ti2v", image=gradient_image((255, 0, 0))))
    green = pipe.generate(request("wan-tiny-ti2v", image=gradient_image((0, 255, 0))))
    for result in (text_only, red, green):
        assert result.frames.shape == (9, 64, 64, 3)
    assert not np.array_equal(red.frames, green.frames)
    assert not np.array_equal(text_only.frames, red.frames)


@pytest.mark.parametrize("model, kind", [("wan-tiny", "t2v"), ("wan-tiny-i2v", "i2v"), ("wan-tiny-ti2v", "ti2v")])
def test_exported_folder_reproduces_the_builtin_model(tmp_path, model, kind):
    builtin = get_pipeline(resolve(model), "cpu", "float32")
    builtin.save(str(tmp_path))
    spec = spec_from_folder(tmp_path)
    assert spec.kind == kind and spec.fps == builtin.spec.fps and spec.vae_stride == builtin.spec.vae_stride
    loaded = VideoPipeline.load(spec, torch.device("cpu"), torch.float32)
    image = gradient_image((255, 128, 0)) if kind != "t2v" else None
    a = builtin.generate(request(model, image=image))
    b = loaded.generate(build_request(spec, SETTINGS, "a red fox in snow", GenerationOptions(steps=2, seed=7),
                                      size="64x64", num_frames=9, image=image))
    assert np.array_equal(a.frames, b.frames)
