"""The request rules shared by the CLI and the API: frames, sizes, limits, defaults."""

import pytest
from apps import app_client, idle_services

from vidserve.config import Settings
from vidserve.errors import InvalidRequest, UnknownModel
from vidserve.media.drift import MIN_CHUNK_FRAMES
from vidserve.registry import MODELS, resolve
from vidserve.options import GenerationOptions
from vidserve.video_request import MIN_FRAMES, build_request, frames_for_seconds, parse_size

SETTINGS = Settings()
TINY = MODELS["wan-tiny"]


@pytest.mark.parametrize("seconds, fps, frames", [(5, 16, 81), (2, 16, 33), (1, 16, 17), (0.1, 16, 5), (5, 24, 121),
                                                  (2.5, 16, 41), (1.3, 10, 17)])
def test_frames_for_seconds(seconds, fps, frames):
    assert frames_for_seconds(seconds, fps) == frames
    assert frames % 4 == 1


def test_defaults_come_from_the_model():
    req = build_request(TINY, SETTINGS, "a fox")
    assert (req.width, req.height, req.fps, req.num_frames, req.steps) == (64, 64, 16, 33, 4)
    assert 0 <= req.seed < 2**31


def test_seconds_and_size_resolve():
    req = build_request(TINY, SETTINGS, "a fox", GenerationOptions(steps=3, seed=5), size="128x64", seconds=2, fps=16)
    assert (req.width, req.height, req.num_frames, req.steps, req.seed) == (128, 64, 33, 3, 5)
    assert req.seconds == 2.0


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(size="60x64"), "size"),
        (dict(size="64"), "size"),
        (dict(size="0x64"), "size"),
        (dict(size="4096x64"), "size"),
        (dict(num_frames=30), "num_frames"),
        (dict(num_frames=0), "num_frames"),
        (dict(num_frames=1), "num_frames"),
        (dict(seconds=-1), "seconds"),
        (dict(seconds=0), "seconds"),
        (dict(seconds=10_000), "seconds"),
        (dict(steps=0), "num_inference_steps"),
        (dict(steps=1000), "num_inference_steps"),
        (dict(fps=0), "fps"),
        (dict(guidance=-1.0), "guidance_scale"),
        (dict(seed=-3), "seed"),
        (dict(seconds=2, num_frames=33), "num_frames"),
    ],
)
def test_bad_values_name_the_field(kwargs, param):
    with pytest.raises(InvalidRequest) as err:
        options = {k: v for k, v in kwargs.items() if k in GenerationOptions.model_fields}
        geometry = {k: v for k, v in kwargs.items() if k not in options}
        build_request(TINY, SETTINGS, "a fox", GenerationOptions(**options), **geometry)
    assert err.value.param == param
    assert str(err.value)


def test_empty_prompt_rejected():
    with pytest.raises(InvalidRequest, match="prompt"):
        build_request(TINY, SETTINGS, "   ")


def test_image_rules_follow_the_model_kind():
    with pytest.raises(InvalidRequest, match="image-to-video"):
        build_request(MODELS["wan-tiny-i2v"], SETTINGS, "a fox")
    with pytest.raises(InvalidRequest, match="takes no image"):
        build_request(TINY, SETTINGS, "a fox", image=object())
    build_request(MODELS["wan-tiny-ti2v"], SETTINGS, "a fox")  # text alone is fine for TI2V


def test_wan22_sizes_follow_the_16x_vae():
    spec = MODELS["Wan2.2-TI2V-5B"]
    assert spec.size_multiple == 32
    with pytest.raises(InvalidRequest, match="multiples of 32"):
        build_request(spec, SETTINGS, "a fox", size="48x48")
    assert spec.token_grid(121, 1280, 704) == (31, 22, 40)


def test_sizes_stop_where_the_models_position_table_ends():
    shapes = MODELS["wan-shapes"]  # 64 positions of 8 px a side
    assert build_request(shapes, SETTINGS, "a red circle", size="512x64").width == 512
    with pytest.raises(InvalidRequest, match="larger than wan-shapes can make") as err:
        build_request(shapes, SETTINGS, "a red circle", size="528x64")
    assert err.value.param == "size" and "from 16 to 512 pixels" in str(err.value)
    with pytest.raises(InvalidRequest, match="exceeds the limit of 1280") as err:  # the server's limit is lower
        build_request(TINY, SETTINGS, "a fox", size="1296x64")
    assert err.value.param == "size"


@pytest.mark.parametrize("model, size, warned", [
    ("wan-shapes", "64x64", False), ("wan-shapes", "80x64", False), ("wan-shapes", "128x128", True),
    ("wan-shapes", "32x32", True), ("wan-shapes", "64x128", True),
    ("Wan2.1-T2V-1.3B", "832x480", False), ("Wan2.1-T2V-1.3B", "480x832", False), ("Wan2.1-T2V-1.3B", "256x256", True),
    ("wan-tiny", "512x64", False),  # random weights: no size is nearer its training than another
])
def test_a_size_far_from_training_is_made_with_a_warning(model, size, warned):
    def size_warnings(request):
        return [w for w in request.warnings if w.code == "untrained_size"]

    prompt = "a red circle moving left on a black background"
    request = build_request(MODELS[model], SETTINGS, prompt, size=size)
    assert len(size_warnings(request)) == warned
    extension = build_request(MODELS[model], SETTINGS, prompt, size=size, image=object(), continuing=True)
    assert size_warnings(extension) == size_warnings(request)


def test_token_grid_of_a_480p_clip():
    assert MODELS["Wan2.1-T2V-1.3B"].token_grid(81, 832, 480) == (21, 30, 52)


def test_limits_come_from_settings():
    tight = Settings(max_seconds=1.0)
    with pytest.raises(InvalidRequest, match="at most 1"):
        build_request(TINY, tight, "a fox", seconds=2)
    with pytest.raises(InvalidRequest, match="exceeds"):
        build_request(TINY, tight, "a fox", num_frames=33)


def test_parse_size():
    assert parse_size("832x480") == (832, 480)
    with pytest.raises(InvalidRequest):
        parse_size("axb")


def test_unknown_model_lists_known_ones():
    with pytest.raises(UnknownModel) as err:
        resolve("no-such-model")
    assert "wan-tiny" in str(err.value) and err.value.code == "model_not_found"


def test_fewer_frames_than_a_chunk_makes_are_refused_naming_the_minimum():
    with pytest.raises(InvalidRequest, match=f"at least {MIN_FRAMES}") as err:
        build_request(TINY, SETTINGS, "a fox", num_frames=1)
    assert err.value.param == "num_frames"
    assert build_request(TINY, SETTINGS, "a fox", num_frames=MIN_FRAMES).chunk_frames == (MIN_FRAMES,)
    with pytest.raises(InvalidRequest, match=f"at least {MIN_FRAMES - 1}") as err:  # an extension opens on a frame
        build_request(TINY, SETTINGS, "a fox", num_frames=0, image=object(), continuing=True)
    assert err.value.param == "num_frames"
    extension = build_request(TINY, SETTINGS, "a fox", num_frames=MIN_FRAMES - 1, image=object(), continuing=True)
    assert extension.chunk_frames == (MIN_FRAMES,)


def accepted(spec, **length) -> tuple[int, ...] | None:
    """The chunk plan of a request for `spec` of this length, or None where it is refused."""
    image = object() if spec.accepts_image or length.get("continuing") else None
    try:
        return build_request(spec, SETTINGS, "a fox", image=image, **length).chunk_frames
    except InvalidRequest:
        return None


@pytest.mark.parametrize("spec", sorted({spec.frames_per_chunk: spec for spec in MODELS.values()}.values(),
                                        key=lambda spec: spec.frames_per_chunk), ids=lambda spec: spec.name)
def test_every_length_accepted_is_one_the_chain_can_make(spec):
    """What build_request lets through, the worker's chain (drift.chain) runs: every chunk of
    every frame count, length in seconds and extension it accepts makes at least MIN_CHUNK_FRAMES."""
    lengths = [dict(num_frames=n) for n in range(SETTINGS.max_frames + 2)]
    lengths += [dict(seconds=tenths / 10) for tenths in range(1, int(SETTINGS.max_seconds * 10) + 1)]
    lengths += [dict(num_frames=n, continuing=True) for n in range(SETTINGS.max_frames + 2)]
    lengths += [dict(seconds=tenths / 10, continuing=True) for tenths in range(1, int(SETTINGS.max_seconds * 10) + 1)]
    plans = {str(length): accepted(spec, **length) for length in lengths}
    too_short = {length: plan for length, plan in plans.items() if plan is not None and min(plan) < MIN_CHUNK_FRAMES}
    assert not too_short
    assert plans[str(dict(num_frames=MIN_FRAMES))] is not None  # the minimum itself is accepted


def test_the_api_refuses_one_frame_with_a_400_naming_the_minimum(tmp_path):
    with app_client(tmp_path, idle_services(tmp_path)) as (client, _):
        answer = client.post("/v1/videos", json={"model": "wan-tiny", "prompt": "a fox", "num_frames": 1})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "num_frames" and f"at least {MIN_FRAMES}" in error["message"], error
