"""The `vidserve` command as a user runs it: real processes, real MP4s, exit codes."""

import json
import os
import subprocess
import sys
from importlib.metadata import version

import numpy as np
import pytest
import torch
from PIL import Image

from probe import probe

from vidserve import cli
from vidserve.media import read_video
from vidserve.options import GenerationOptions

FOX = ["generate", "a red fox in snow", "--size", "64x64", "--seconds", "2", "--fps", "16", "--steps", "4", "-q"]


def vidserve(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "vidserve.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=300)


def generate(tmp_path, name, *args):
    out = tmp_path / name
    result = vidserve(*FOX, *args, "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    return read_video(out)


def test_generate_determinism_and_seed(tmp_path):
    frames, fps = generate(tmp_path, "a.mp4", "--model", "wan-tiny", "--seed", "7")
    assert frames.shape == (33, 64, 64, 3) and fps == 16
    again, _ = generate(tmp_path, "b.mp4", "--model", "wan-tiny", "--seed", "7")
    other, _ = generate(tmp_path, "c.mp4", "--model", "wan-tiny", "--seed", "8")
    assert np.array_equal(frames, again)
    assert not np.array_equal(frames, other)


def test_generate_reports_timings(tmp_path):
    result = vidserve(*FOX, "--model", "wan-tiny", "--seed", "1", "-o", str(tmp_path / "t.mp4"))
    assert result.returncode == 0, result.stderr
    for phase in ("load", "denoise", "decode", "encode"):
        assert f"{phase} " in result.stderr


def test_image_models(tmp_path):
    image = tmp_path / "start.png"
    Image.new("RGB", (96, 64), (200, 40, 40)).save(image)
    i2v, _ = generate(tmp_path, "i2v.mp4", "--model", "wan-tiny-i2v", "--image", str(image), "--seed", "1")
    ti2v_text, fps = generate(tmp_path, "ti2v.mp4", "--model", "wan-tiny-ti2v", "--seed", "1")
    ti2v_image, _ = generate(tmp_path, "ti2v-img.mp4", "--model", "wan-tiny-ti2v", "--image", str(image),
                             "--seed", "1")
    assert i2v.shape == ti2v_text.shape == ti2v_image.shape == (33, 64, 64, 3)
    assert fps == 16  # --fps given explicitly overrides the model's 24
    assert not np.array_equal(ti2v_text, ti2v_image)


def test_export_tiny_round_trip(tmp_path):
    folder = tmp_path / "wan-tiny-export"
    result = vidserve("export-tiny", str(folder))
    assert result.returncode == 0, result.stderr
    assert (folder / "model_index.json").exists()
    builtin, _ = generate(tmp_path, "builtin.mp4", "--model", "wan-tiny", "--seed", "3")
    exported, _ = generate(tmp_path, "exported.mp4", "--model", str(folder), "--seed", "3")
    assert np.array_equal(builtin, exported)


def non_image_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not an image")
    return str(path)


BAD_INPUTS = {
    "missing image": lambda tmp: ["--model", "wan-tiny-i2v", "--image", str(tmp / "nope.png")],
    "non-image file": lambda tmp: ["--model", "wan-tiny-i2v", "--image", non_image_file(tmp)],
    "size not a multiple of 16": lambda tmp: ["--size", "60x64"],
    "size past the model's position table": lambda tmp: ["--model", "wan-shapes", "--size", "528x64"],
    "frames not 4k+1": lambda tmp: ["--frames", "30"],
    "fewer frames than a chunk makes": lambda tmp: ["--frames", "1"],
    "zero steps": lambda tmp: ["--steps", "0"],
    "negative seconds": lambda tmp: ["--seconds", "-1"],
    "too many seconds": lambda tmp: ["--seconds", "100000"],
    "steps not a number": lambda tmp: ["--steps", "many"],
    "unknown model": lambda tmp: ["--model", "no-such-model"],
    "i2v without image": lambda tmp: ["--model", "wan-tiny-i2v"],
    "unknown dtype": lambda tmp: ["--dtype", "bogus"],
    "malformed device": lambda tmp: ["--device", "gpu0"],
    "cuda without a GPU": lambda tmp: ["--model", "wan-tiny", "--device", "cuda"],
    "offload on the CPU": lambda tmp: ["--model", "wan-tiny", "--device", "cpu", "--offload", "model"],
    "fp8 on the CPU": lambda tmp: ["--model", "wan-tiny", "--device", "cpu", "--quantization", "fp8"],
    "unknown option": lambda tmp: ["--model", "wan-tiny", "--bogus"],
    "prores in webm": lambda tmp: ["--model", "wan-tiny", "-o", f"{tmp / 'x.webm'},codec=prores"],
    "an output of no known kind": lambda tmp: ["--model", "wan-tiny", "-o", str(tmp / "x.avi")],
    "an output option without a value": lambda tmp: ["--model", "wan-tiny", "-o", f"{tmp / 'x.gif'},fps"],
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, case):
    """In this process (`cli.main` is what `python -m vidserve.cli` exits with): a process per case
    would spend seconds importing torch to check one argument."""
    if case == "cuda without a GPU" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    out = tmp_path / "x.mp4"
    # --frames and --seconds are exclusive, so the base command names neither.
    try:
        code = cli.main(["generate", "a red fox", "--size", "64x64", "-o", str(out), *BAD_INPUTS[case](tmp_path)])
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    stderr = capsys.readouterr().err
    assert code == 2, (case, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vidserve: error: "), stderr
    assert "Traceback" not in stderr
    assert not out.exists()


def test_an_unknown_option_points_to_the_subcommands_help(tmp_path):
    result = vidserve("worker", "--model", "wan-tiny", "--gpus", "2")
    assert result.returncode == 2
    assert result.stderr.strip() == "vidserve: error: unrecognized arguments: --gpus 2 (see 'vidserve worker --help')"


def test_a_model_neither_cached_nor_downloadable_is_one_line_saying_how_to_get_it(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run([sys.executable, "-m", "vidserve.cli", "generate", "a fox", "--model", "Wan2.1-T2V-1.3B",
                             "--frames", "5", "--size", "64x64", "-q", "-o", str(tmp_path / "x.mp4")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "vidserve: error: model Wan-AI/Wan2.1-T2V-1.3B-Diffusers is not in the local cache and could not be "
        "downloaded: fetch it with `hf download Wan-AI/Wan2.1-T2V-1.3B-Diffusers` where there is internet "
        "(HF_HOME picks the cache), or pass a local diffusers folder")
    assert "Traceback" not in result.stderr


def test_every_option_has_help_with_defaults_as_values():
    parser = cli.build_parser()
    subcommands = parser._subparsers._group_actions[0].choices
    assert set(subcommands) == {"generate", "serve", "worker", "check", "models", "export-tiny", "hash-key"}
    for name, sub in subcommands.items():
        for action in sub._actions:
            assert action.help, f"vidserve {name} {action.dest} has no help"
            assert "settings." not in action.help, f"vidserve {name} {action.dest}: {action.help}"
    generate_help = subcommands["generate"].format_help()
    assert "(default: wan-tiny)" in generate_help  # conftest's VIDSERVE_DEFAULT_MODEL, the effective value


# One value away from its default for each generation option (the API's spelling of it).
OPTIONS = {"negative_prompt": "blurry", "seed": 1234, "num_inference_steps": 3, "guidance_scale": 2.5,
           "drift_correction": "none", "preset": "fast"}


def test_generate_takes_every_generation_option():
    """Each option is a flag made from its declaration, or one the CLI spells its own way, or
    one left to the server (it needs the LLM path); a value given reaches the request."""
    made = cli._option_flags()
    assert set(GenerationOptions.model_fields) == set(made) | set(cli._OWN_FLAGS) | set(cli._SERVER_ONLY)
    args = ["generate", "a fox"]
    for name, field in made.items():
        value = OPTIONS[field.alias or name]
        args += [f"--{name.replace('_', '-')}"] + ([] if isinstance(value, bool) else [str(value)])
    args += ["--chunk-prompt", "the fox sits", "--chunk-prompt", "the fox runs", "--attention", "topk",
             "--density", "0.25", "--dense-steps", "2", "--cache", "first_block", "--cache-threshold", "0.1",
             "--lora", "tiny-style:0.5"]
    options = cli._generation_options(cli.build_parser().parse_args(args))
    assert {field.alias or name: getattr(options, name) for name, field in made.items()} == OPTIONS
    assert options.prompts == ["the fox sits", "the fox runs"]
    assert options.attention == {"mode": "topk", "density": 0.25, "dense_steps": 2}
    assert options.cache == {"kind": "first_block", "threshold": 0.1}
    assert [(lora.name, lora.scale) for lora in options.loras] == [("tiny-style", 0.5)]


def test_version():
    result = vidserve("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"vidserve {version('vidserve')}"


def test_models_lists_the_registry():
    result = vidserve("models")
    assert result.returncode == 0
    for name in ("wan-tiny", "wan-tiny-i2v", "wan-tiny-ti2v", "Wan2.1-T2V-1.3B", "Wan2.1-I2V-14B-720P",
                 "Wan2.2-TI2V-5B", "Wan2.2-T2V-A14B", "Wan2.2-I2V-A14B"):
        assert name in result.stdout


def test_serving_a_public_address_needs_keys_or_an_explicit_flag(tmp_path):
    for flags, env in ((["--host", "0.0.0.0"], {}), ([], {"VIDSERVE_HOST": "0.0.0.0"})):  # a container's way
        result = vidserve("serve", *flags, "--data-dir", str(tmp_path), env=env)
        assert result.returncode == 2
        assert result.stderr.strip().startswith("vidserve: error: refusing to serve 0.0.0.0 without API keys")


def test_long_video_chains_chunks_and_writes_a_report(tmp_path):
    out, report = tmp_path / "long.mp4", tmp_path / "r.json"
    # 5 s at 16 fps = 81 frames = chunks of 33 + 32 + 16 new frames with wan-tiny's 33-frame chunks.
    result = vidserve("generate", "a fox walks", "--model", "wan-tiny", "--size", "64x64", "--fps", "16",
                      "--seconds", "5", "--steps", "2", "--seed", "4", "-q", "--report", str(report), "-o", str(out))
    assert result.returncode == 0, result.stderr
    frames, _ = read_video(out)
    assert frames.shape[0] == 81
    data = json.loads(report.read_text())
    assert data["frames"] == 81 and [c["frames"] for c in data["chunks"]] == [33, 32, 16]
    for chunk in data["chunks"]:
        assert {"mean_luma", "channel_mean", "channel_std", "histogram_distance", "sharpness", "luma_change",
                "sharpness_ratio"} <= set(chunk["drift"])
    assert "luma Δ" in result.stderr  # the per-chunk drift table


def test_generate_writes_each_output_asked_for(tmp_path):
    mp4, webm, frames, report = (tmp_path / name for name in ("fox.mp4", "fox.webm", "fox.zip", "r.json"))
    result = vidserve(*FOX, "--model", "wan-tiny", "--seed", "2", "--report", str(report), "-o", str(mp4),
                      "-o", f"{webm},fps=30,fps_mode=blend,quality=40,size=32x32", "-o", str(frames))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(mp4), str(webm), str(frames)]
    found = probe(webm)
    assert (found.codec, found.fps, found.width, found.frames) == ("vp9", 30, 32, 61)  # 33 frames at 16 fps
    assert probe(mp4).tags["seed"] == "2"
    outputs = json.loads(report.read_text())["outputs"]
    assert [(o["path"], o["format"], o["frames"]) for o in outputs] == [(str(mp4), "mp4", 33), (str(webm), "webm", 61),
                                                                        (str(frames), "frames", 33)]
