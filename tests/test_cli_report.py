"""`vidserve generate --report` says what the API's video object would: each chunk of a long
video checked as it is made, a blank one named by its index, and a prompt the model cannot read.
In this process (`cli.main` is what `python -m vidserve.cli` exits with): a process per run
would spend most of its time importing torch again."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from vidserve import cli


@pytest.fixture(scope="module")
def black_model(tmp_path_factory):
    """wan-tiny as a folder whose VAE decodes every latent to black: its chunks are blank, while
    the chunks after the first come from wan-tiny-i2v (its continuation), which makes noise."""
    folder = tmp_path_factory.mktemp("black") / "wan-tiny-black"
    assert cli.main(["export-tiny", str(folder)]) == 0
    weights = folder / "vae" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    tensors["decoder.conv_out.weight"].zero_()
    tensors["decoder.conv_out.bias"].fill_(-10.0)  # below -1 on every channel: black once clamped
    save_file(tensors, weights)
    return folder


def test_a_blank_chunk_of_a_long_video_is_named_in_the_report(tmp_path, capsys, black_model):
    report, out = tmp_path / "r.json", tmp_path / "long.mp4"
    # 3 s at 16 fps: 49 frames, chunks of 33 + 16 new frames. Without drift correction, which
    # would pull the second chunk towards the first's black.
    code = cli.main(["generate", "a fox walks", "--model", str(black_model), "--seconds", "3", "--fps", "16",
                     "--steps", "1", "--seed", "3", "--drift-correction", "none", "-q", "--report", str(report),
                     "-o", str(out)])
    stderr = capsys.readouterr().err
    assert code == 0, stderr
    blank = {"code": "blank_output", "chunk": 0,
             "message": "chunk 1: all 33 frames are nearly black (mean luma 0.0/255); try another seed or prompt"}
    data = json.loads(report.read_text())
    assert [c["frames"] for c in data["chunks"]] == [33, 16]
    assert data["warnings"] == [blank]  # the whole video, noise after black, is not blank: only its chunk is
    assert f"vidserve: warning: blank_output: {blank['message']}" in stderr


def test_a_prompt_the_model_cannot_read_is_said_before_generating_and_reported(tmp_path, capsys):
    report = tmp_path / "r.json"
    code = cli.main(["generate", "un círculo rojo", "--model", "wan-shapes", "--steps", "1", "--seed", "1", "-q",
                     "--report", str(report), "-o", str(tmp_path / "x.mp4")])
    stderr = capsys.readouterr().err
    assert code == 0, stderr
    [warning] = [w for w in json.loads(report.read_text())["warnings"] if w["code"] == "prompt_not_understood"]
    assert warning["message"].startswith("prompt names none of the colours, shapes or motions wan-shapes knows")
    said = f"vidserve: warning: prompt_not_understood: {warning['message']}"
    assert stderr.index(said) < stderr.index("seed 1, 17 frames")  # before the clip is made
