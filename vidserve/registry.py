"""Named model specs: what serving needs to know about a checkpoint before loading it.

A spec is pure data (no torch), so the API can validate requests against it. `--model`
accepts a registry name or a local diffusers folder (`resolve_local`), whose spec is read
from its `model_index.json` and component configs; API requests get registry names and the
folders in the configured model directories only (`resolve`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from vidserve.errors import InvalidRequest, UnknownModel, echo
from vidserve.loras import LIGHTX2V_I2V_14B_480P, LIGHTX2V_T2V_14B, PUBLIC_ADAPTERS, LoraRequest
from vidserve.vocabulary import PromptVocabulary


@dataclass(frozen=True)
class Preset:
    """Sampling settings that go together, e.g. a step-distilled adapter's: a request naming
    the preset gets these, and its own fields still override them."""

    steps: int
    guidance: float
    flow_shift: float | None = None  # None: the model's
    loras: tuple[LoraRequest, ...] = ()  # adapters the preset adds; they must be registered
    description: str = ""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str  # t2v: text only; i2v: needs an image; ti2v: text, with an optional first frame
    source: str  # hub id, local folder, or "builtin" for models built in code
    width: int  # native size
    height: int
    fps: int
    frames_per_chunk: int  # the clip length the model was trained on (4k+1)
    flow_shift: float
    experts: int = 1  # Wan2.2 A14B: a high-noise and a low-noise transformer
    boundary_ratio: float | None = None  # where the high-noise expert hands over
    vae_stride: tuple[int, int, int] = (4, 8, 8)  # (t, h, w) compression of the VAE
    patch_size: tuple[int, int, int] = (1, 2, 2)  # (t, h, w) patchify of the transformer
    default_steps: int = 50
    default_guidance: float = 5.0
    continues_with: str | None = None  # the image-to-video model that extends this model's clips
    text_tokens: int = 512  # prompts are padded/truncated to this many tokens, as the model was trained
    description: str = ""
    presets: tuple[tuple[str, Preset], ...] = ()  # (name, preset) pairs
    # The prompts it understands, for a model trained on one caption pattern; None: any text (an
    # open-vocabulary text encoder), or none in particular (random weights).
    understands: PromptVocabulary | None = None
    # The transformer's rotary position table (its `rope_max_seq_len`): tokens along each axis. A
    # clip with more tokens a side than this fails in the model, so it bounds the size it can make.
    positions: int = 1024
    # (width, height) sizes it was trained at; sizes far from all of them come out as noise. None
    # for random weights, which make noise at any size.
    trained_sizes: tuple[tuple[int, int], ...] = ()

    def preset(self, name: str) -> Preset:
        found = dict(self.presets).get(name)
        if found is None:
            known = ", ".join(n for n, _ in self.presets) or "none"
            raise InvalidRequest(f"model {self.name} has no preset {echo(name)}; its presets: {known}", param="preset")
        return found

    @property
    def needs_image(self) -> bool:
        return self.kind == "i2v"

    @property
    def accepts_image(self) -> bool:
        return self.kind in ("i2v", "ti2v")

    @property
    def size_multiple(self) -> int:
        """Width and height must be multiples of this (VAE stride x patch, at least 16)."""
        return max(16, self.vae_stride[1] * self.patch_size[1], self.vae_stride[2] * self.patch_size[2])

    @property
    def max_side(self) -> int:
        """The largest width or height its position table covers, a multiple of `size_multiple`."""
        pixels_per_token = min(self.vae_stride[1] * self.patch_size[1], self.vae_stride[2] * self.patch_size[2])
        return self.positions * pixels_per_token // self.size_multiple * self.size_multiple

    def untrained_size(self, width: int, height: int) -> tuple[int, int] | None:
        """The trained size nearest (width, height) when every trained size has a side more than
        `TRAINED_SIDE_FACTOR` times larger or smaller than this one's; None when one is near."""
        if not self.trained_sizes:
            return None

        def distance(trained: tuple[int, int]) -> float:  # the worst side's ratio, either way
            return max(max(a / b, b / a) for a, b in zip((width, height), trained))

        nearest = min(self.trained_sizes, key=distance)
        return nearest if distance(nearest) > TRAINED_SIDE_FACTOR else None

    @property
    def builtin(self) -> bool:
        return self.source == "builtin"

    def token_grid(self, num_frames: int, width: int, height: int) -> tuple[int, int, int]:
        """(F, H, W) of the DiT's spatiotemporal tokens for a clip of this size."""
        t, h, w = self.vae_stride
        pt, ph, pw = self.patch_size
        return ((num_frames - 1) // t + 1) // pt, height // h // ph, width // w // pw


# How far a side may be from a trained size's before the size is called untrained: wan-shapes,
# trained at 64x64, makes noise at 128x128.
TRAINED_SIDE_FACTOR = 1.5

WEIGHTS = Path(__file__).resolve().parent / "weights"  # the trained shapes-world models (training/)

# The words of training/shapes_world.py's captions that wan-shapes' tokenizer knows (its other
# words are fillers: "a", "on", "moving"...); tests/test_prompt_understanding.py checks both.
SHAPES_CAPTIONS = PromptVocabulary(
    examples=("a red circle moving left on a black background",
              "a blue square bouncing and a yellow triangle standing still on a white background"),
    colours=("red", "green", "blue", "yellow"), shapes=("circle", "square", "triangle"),
    motions=("left", "right", "up", "down", "bouncing", "still"), backgrounds=("black", "white", "gray"),
    synonyms=(("grey", "gray"), ("disc", "circle"), ("disk", "circle"), ("leftward", "left"), ("rightward", "right"),
              ("upward", "up"), ("downward", "down"), ("static", "still"), ("stationary", "still"),
              ("bounces", "bouncing")))
# vlm-shapes' questions about a frame; it also names cyan and magenta, from its repainted frames.
SHAPES_QUESTIONS = PromptVocabulary(
    examples=("Describe the image.", "What colour is the circle?", "What shape is it?",
              "What colour is the background?", "How many shapes are there?"),
    colours=("red", "green", "blue", "yellow", "cyan", "magenta"), shapes=("circle", "square", "triangle"),
    backgrounds=("black", "white", "gray"))

_WAN21 = dict(vae_stride=(4, 8, 8), patch_size=(1, 2, 2))


def _distilled(*loras: LoraRequest) -> tuple[tuple[str, Preset], ...]:
    """lightx2v's published step- and CFG-distilled adapters: 4 steps, guidance off, shift 5.
    Those in `PUBLIC_ADAPTERS` register once their files are in a lora dir; the operator
    registers the others under these names."""
    if all(lora.name in PUBLIC_ADAPTERS for lora in loras):
        how = " and ".join(PUBLIC_ADAPTERS[lora.name].filename for lora in loras) + " in a lora dir"
    else:
        how = "register it as " + " and ".join(repr(lora.name) for lora in loras) + ": --lora NAME=PATH"
    return (("distill-4step", Preset(4, 1.0, 5.0, loras,
                                     f"4 steps without CFG through lightx2v's distilled LoRA ({how})")),)
_WAN22_5B = dict(vae_stride=(4, 16, 16), patch_size=(1, 2, 2))
# The sizes Wan's model cards give for each checkpoint, landscape and portrait.
_480P = ((832, 480), (480, 832))
_720P = ((1280, 720), (720, 1280))

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec("wan-shapes", "ti2v", str(WEIGHTS / "wan-shapes"), 64, 64, 16, 17, 2.0, default_steps=20,
                  default_guidance=4.0, continues_with="wan-shapes", vae_stride=(4, 4, 4), patch_size=(1, 2, 2),
                  text_tokens=24, positions=64, trained_sizes=((64, 64),),
                  description="Wan2.2-TI2V-style model trained on the shapes world (training/): "
                  "coloured shapes moving on plain backgrounds; text or first frame to video",
                  understands=SHAPES_CAPTIONS,
                  presets=(("draft", Preset(8, 4.0, description="8 steps instead of 20: a quick look")),
                           ("fast", Preset(4, 1.0, 2.0, (LoraRequest(name="wan-shapes-4step"),),
                                           "4 steps without guidance (one transformer call a step) through the "
                                           "bundled step-distilled adapter wan-shapes-4step")))),
        ModelSpec("wan-tiny", "t2v", "builtin", 64, 64, 16, 33, 3.0, default_steps=4, continues_with="wan-tiny-i2v",
                  description="Random-weight Wan2.1-style text-to-video, built in code (tests, demos)",
                  presets=(("fast", Preset(2, 1.0, 2.0, description="2 steps, no CFG, shift 2")),), **_WAN21),
        ModelSpec("wan-tiny-i2v", "i2v", "builtin", 64, 64, 16, 33, 3.0, default_steps=4, continues_with="wan-tiny-i2v",
                  description="Random-weight Wan2.1-style image-to-video with a tiny CLIP encoder", **_WAN21),
        ModelSpec("wan-tiny-ti2v", "ti2v", "builtin", 64, 64, 24, 33, 5.0, default_steps=4,
                  continues_with="wan-tiny-ti2v",
                  description="Random-weight Wan2.2-style text/image-to-video (expand_timesteps)", **_WAN22_5B),
        # Wan2.1 ships no 1.3B image-to-video model; its 480p clips continue on the 14B one.
        ModelSpec("Wan2.1-T2V-1.3B", "t2v", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", 832, 480, 16, 81, 3.0,
                  default_guidance=5.0, continues_with="Wan2.1-I2V-14B-480P", trained_sizes=_480P, **_WAN21),
        ModelSpec("Wan2.1-T2V-14B", "t2v", "Wan-AI/Wan2.1-T2V-14B-Diffusers", 1280, 720, 16, 81, 5.0,
                  continues_with="Wan2.1-I2V-14B-720P", presets=_distilled(LoraRequest(name=LIGHTX2V_T2V_14B.name)),
                  trained_sizes=_720P + _480P, **_WAN21),
        ModelSpec("Wan2.1-I2V-14B-480P", "i2v", "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers", 832, 480, 16, 81, 3.0,
                  continues_with="Wan2.1-I2V-14B-480P",
                  presets=_distilled(LoraRequest(name=LIGHTX2V_I2V_14B_480P.name)), trained_sizes=_480P, **_WAN21),
        ModelSpec("Wan2.1-I2V-14B-720P", "i2v", "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers", 1280, 720, 16, 81, 5.0,
                  continues_with="Wan2.1-I2V-14B-720P", presets=_distilled(LoraRequest(name="lightx2v-i2v-14b-720p")),
                  trained_sizes=_720P, **_WAN21),
        ModelSpec("Wan2.2-TI2V-5B", "ti2v", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", 1280, 704, 24, 121, 5.0,
                  continues_with="Wan2.2-TI2V-5B", trained_sizes=((1280, 704), (704, 1280)), **_WAN22_5B),
        ModelSpec("Wan2.2-T2V-A14B", "t2v", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", 1280, 720, 16, 81, 12.0,
                  experts=2, boundary_ratio=0.875, default_guidance=4.0, continues_with="Wan2.2-I2V-A14B",
                  presets=_distilled(LoraRequest(name="lightning-t2v-a14b-high", target="high"),
                                     LoraRequest(name="lightning-t2v-a14b-low", target="low")),
                  trained_sizes=_720P + _480P, **_WAN21),
        ModelSpec("Wan2.2-I2V-A14B", "i2v", "Wan-AI/Wan2.2-I2V-A14B-Diffusers", 1280, 720, 16, 81, 5.0,
                  experts=2, boundary_ratio=0.9, default_guidance=3.5, continues_with="Wan2.2-I2V-A14B",
                  presets=_distilled(LoraRequest(name="lightning-i2v-a14b-high", target="high"),
                                     LoraRequest(name="lightning-i2v-a14b-low", target="low")),
                  trained_sizes=_720P + _480P, **_WAN21),
    ]
}


SERVING_FILE = "vidserve.json"
_FAMILY_DEFAULT = {"t2v": "Wan2.1-T2V-1.3B", "i2v": "Wan2.1-I2V-14B-480P", "ti2v": "Wan2.2-TI2V-5B"}


def resolve(name: str, model_dirs: Sequence[Path] = ()) -> ModelSpec:
    """A registry name, or a diffusers folder directly inside one of `model_dirs`, named by its
    folder name (or by the full path a job records). What a client may ask for: never any other
    path, and an unknown name gets the same error whether or not a path by that name exists."""
    if name in MODELS:
        return MODELS[name]
    for root in model_dirs:
        root = Path(root).resolve()
        # Lexical, so ".." cannot climb out, while a link the operator put in the folder still works.
        folder = Path(os.path.normpath(root / name))
        if folder.parent == root and (folder / "model_index.json").is_file():
            return spec_from_folder(folder)
    raise UnknownModel(name, list(MODELS), "a model folder in VIDSERVE_MODEL_DIRS")


def resolve_local(name: str) -> ModelSpec:
    """A registry name, or any local diffusers folder: for the operator's own choices (the CLI's
    --model, a worker's model, the server's default) and for models the API resolved already."""
    if name in MODELS:
        return MODELS[name]
    path = Path(name).expanduser()
    if path.is_dir():
        return spec_from_folder(path)
    raise UnknownModel(name, list(MODELS))


def cached_snapshot(repo: str) -> str | None:
    """The folder of a hub model's snapshot in the hub cache (HF_HOME); None if it is not there,
    or `repo` is no hub id (a folder that is gone). Reads no weights and asks no server, so the
    API can ask at each submission."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo, local_files_only=True)
    except (OSError, ValueError):
        return None


def weights_here(spec: ModelSpec) -> bool:
    """Whether `spec` loads on this machine without a download: a built-in model always does, a
    folder if it exists, a hub model once its snapshot is cached."""
    return spec.builtin or Path(spec.source).expanduser().is_dir() or cached_snapshot(spec.source) is not None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"{path} is not a readable diffusers model folder: {exc}", param="model") from exc


def spec_from_folder(path: Path) -> ModelSpec:
    index = _read_json(path / "model_index.json")
    pipeline_class = index.get("_class_name", "")
    if pipeline_class not in ("WanPipeline", "WanImageToVideoPipeline"):
        raise InvalidRequest(f"{path}: pipeline {pipeline_class!r} is not a Wan pipeline", param="model")
    transformer = _read_json(path / "transformer" / "config.json")
    vae = _read_json(path / "vae" / "config.json")
    spatial = vae.get("scale_factor_spatial", 8)
    temporal = vae.get("scale_factor_temporal", 4)
    if index.get("expand_timesteps"):
        kind = "ti2v"
    elif pipeline_class == "WanImageToVideoPipeline":
        kind = "i2v"
    else:
        kind = "t2v"
    scheduler = _read_json(path / "scheduler" / "scheduler_config.json")
    # Serving facts (native size, fps, chunk length) are not in diffusers' configs:
    # `export-tiny` writes them to vidserve.json; other folders get their family's.
    serving = _read_json(path / SERVING_FILE) if (path / SERVING_FILE).exists() else {}
    base = MODELS[serving.get("base", _FAMILY_DEFAULT[kind])]
    return replace(
        base,
        name=str(path),
        source=str(path),
        kind=kind,
        flow_shift=float(scheduler.get("flow_shift", scheduler.get("shift", base.flow_shift))),
        experts=2 if (index.get("transformer_2") or [None])[0] else 1,
        boundary_ratio=index.get("boundary_ratio"),
        vae_stride=(temporal, spatial, spatial),
        patch_size=tuple(transformer.get("patch_size", (1, 2, 2))),
        positions=transformer.get("rope_max_seq_len", 1024),  # diffusers' default
        continues_with=str(path) if kind in ("i2v", "ti2v") else base.continues_with,
        description=f"local folder ({pipeline_class})",
    )


@dataclass(frozen=True)
class ChatModelSpec:
    """A model for the LLM path: a vision-language model (encoder + projector + decoder) or a text-only one."""

    name: str
    source: str  # hub id, local folder, or "builtin"
    vision: bool
    description: str = ""
    understands: PromptVocabulary | None = None  # as ModelSpec's: the questions it was trained on

    @property
    def builtin(self) -> bool:
        return self.source == "builtin"


CHAT_MODELS: dict[str, ChatModelSpec] = {
    spec.name: spec
    for spec in [
        ChatModelSpec("vlm-shapes", str(WEIGHTS / "vlm-shapes"), True,
                      "LLaVA-style model trained on shapes-world frames (training/): captions, colours, shapes",
                      SHAPES_QUESTIONS),
        ChatModelSpec("vlm-tiny", "builtin", True,
                      "Random-weight LLaVA-style model (CLIP tower, MLP projector, Llama decoder), built in code"),
        ChatModelSpec("llava-1.5-7b", "llava-hf/llava-1.5-7b-hf", True, "LLaVA-1.5 7B"),
        ChatModelSpec("llava-v1.6-mistral-7b", "llava-hf/llava-v1.6-mistral-7b-hf", True, "LLaVA-NeXT Mistral 7B"),
        ChatModelSpec("Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct", False, "Qwen2.5 0.5B, text only"),
        ChatModelSpec("Qwen2-VL-2B-Instruct", "Qwen/Qwen2-VL-2B-Instruct", True, "Qwen2-VL 2B (images; M-RoPE)"),
        ChatModelSpec("Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct", True, "Qwen2.5-VL 3B (images; M-RoPE)"),
    ]
}


def resolve_chat(name: str) -> ChatModelSpec:
    """A registry name, or a local transformers folder (vision if its config has a vision tower)."""
    if name in CHAT_MODELS:
        return CHAT_MODELS[name]
    path = Path(name).expanduser()
    if path.is_dir():
        config = _read_json(path / "config.json")
        return ChatModelSpec(str(path), str(path), "vision_config" in config,
                             f"local folder ({', '.join(config.get('architectures', []))})")
    raise UnknownModel(name, list(CHAT_MODELS), "a local transformers folder")
