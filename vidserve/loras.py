"""LoRA adapters: which ones a server has, and what a request may ask of them.

An adapter is registered at start — the adapters bundled in `vidserve/weights` (folders with
an `adapter.json`), every adapter in `--lora-dir` folders, and `--lora NAME=PATH` — and a
request names registered adapters only, never a path. A registered adapter is a
`.safetensors` file (diffusers/PEFT, Kohya/musubi or lightx2v layout: diffusers' Wan LoRA
loader converts them) or a folder holding one, with optional metadata in a sidecar JSON
(`NAME.json` beside the file, `adapter.json` in a folder): the base models it fits, its
rank, a description, a recommended preset. Pure data, no torch: the API validates with it.

The adapters a preset applies that are published on the Hugging Face Hub (`PUBLIC_ADAPTERS`)
register under the preset's name for them when their file, under its published name, is in a
lora dir.

`LOADED_ADAPTERS` says which adapters this process's pipelines have loaded: the pipelines
publish to it, the API reads it, so a route never reads the pipelines' module, which a worker
thread may be half-way through importing.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from vidserve.errors import InvalidRequest, VidserveError, echo

BUNDLED = Path(__file__).resolve().parent / "weights"
SIDECAR = "adapter.json"


class LoraRequest(BaseModel):
    """One adapter a request asks for: which, how strongly, and on which expert of a
    two-expert model (Wan2.2 A14B: "high" the high-noise one, "low" the low-noise one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=128)
    scale: float = Field(1.0, ge=-2.0, le=2.0, description="The adapter's weight; 0 leaves it out.")
    target: Literal["both", "high", "low"] = "both"


@dataclass(frozen=True)
class Adapter:
    name: str
    path: Path  # the .safetensors file
    base_models: tuple[str, ...] = ()  # the models it fits (empty: not stated, so any)
    rank: int | None = None
    description: str = ""
    recommended_preset: str | None = None

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size

    def fits(self, model: str) -> bool:
        return not self.base_models or model in self.base_models


@dataclass(frozen=True)
class PublicAdapter:
    """An adapter a preset applies, as published on the Hugging Face Hub: `path` in `repo`."""

    name: str  # what the preset calls it, and what it registers as
    repo: str
    path: str

    @property
    def filename(self) -> str:
        return PurePosixPath(self.path).name

    def fetch_command(self, folder: str) -> str:
        """A command that puts the file in `folder` under its published name. Not `hf download
        --local-dir`: that keeps the repository's sub-folder, and a sub-folder of a lora dir is
        an adapter of its own, named by the folder."""
        return (f"curl -L --create-dirs -o {shlex.quote(str(Path(folder) / self.filename))} "
                f"https://huggingface.co/{self.repo}/resolve/main/{self.path}")


# lightx2v's step- and CFG-distilled adapters, in the repositories lightx2v's step-distillation guide names.
LIGHTX2V_T2V_14B = PublicAdapter("lightx2v-t2v-14b", "lightx2v/Wan2.1-T2V-14B-StepDistill-CfgDistill-Lightx2v",
                                 "loras/Wan21_T2V_14B_lightx2v_cfg_step_distill_lora_rank64.safetensors")
LIGHTX2V_I2V_14B_480P = PublicAdapter("lightx2v-i2v-14b-480p",
                                      "lightx2v/Wan2.1-I2V-14B-480P-StepDistill-CfgDistill-Lightx2v",
                                      "loras/Wan21_I2V_14B_lightx2v_cfg_step_distill_lora_rank64.safetensors")
PUBLIC_ADAPTERS = {adapter.name: adapter for adapter in (LIGHTX2V_T2V_14B, LIGHTX2V_I2V_14B_480P)}
_PUBLISHED_FILES = {adapter.filename: adapter.name for adapter in PUBLIC_ADAPTERS.values()}


def missing_adapter(name: str, folder: str) -> str:
    """What adapter `name`, which is not registered, takes, in one line: for a published one,
    its file and the command that fetches it into `folder`."""
    public = PUBLIC_ADAPTERS.get(name)
    if public is None:
        return f"adapter {name!r} is not registered; register its file with --lora {name}=PATH"
    return (f"adapter {name!r} needs {public.filename}, which is in no lora dir (VIDSERVE_LORA_DIRS); fetch it "
            f"with `{public.fetch_command(folder)}`")


def lora_folders(lora_dirs: str) -> list[str]:
    """The folders of a `lora_dirs` setting: separated by ',' or os.pathsep."""
    return [p for p in (p.strip() for p in lora_dirs.replace(os.pathsep, ",").split(",")) if p]


def _weights_file(path: Path) -> Path:
    if path.is_file():
        return path
    files = sorted(path.glob("*.safetensors"))
    if len(files) != 1:
        raise VidserveError(f"LoRA folder {path} must hold exactly one .safetensors file, it holds {len(files)}")
    return files[0]


def read_adapter(name: str, path: Path) -> Adapter:
    """The adapter at `path` (a file, or a folder with one), with its sidecar's metadata."""
    path = Path(path)
    if not path.exists():
        raise VidserveError(f"LoRA {name!r}: no such file or folder {path}")
    weights = _weights_file(path)
    sidecar = path / SIDECAR if path.is_dir() else path.with_suffix(".json")
    meta = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
    bases = meta.get("base_models") or ([meta["base_model"]] if meta.get("base_model") else [])
    return Adapter(name=name, path=weights, base_models=tuple(bases), rank=meta.get("rank"),
                   description=meta.get("description", ""), recommended_preset=meta.get("recommended_preset"))


def _in_folder(folder: Path, bundled: bool) -> list[Adapter]:
    """A folder's adapters: each `.safetensors` file (named by its stem, or a published adapter's
    file by the preset's name for it) and each sub-folder with one (named by the folder). In the
    bundled weights, only folders with a sidecar are adapters; the others are models."""
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and ((entry / SIDECAR).is_file() or (not bundled and any(entry.glob("*.safetensors")))):
            found.append(read_adapter(entry.name, entry))
        elif not bundled and entry.suffix == ".safetensors":
            found.append(read_adapter(_PUBLISHED_FILES.get(entry.name, entry.stem), entry))
    return found


class LoraRegistry:
    """The adapters a server (or a CLI run) may use, by name."""

    def __init__(self, adapters: list[Adapter], cache_size: int = 8):
        self.cache_size = cache_size  # how many a pipeline keeps loaded
        self.adapters: dict[str, Adapter] = {}
        for adapter in adapters:  # a later registration of a name wins: --lora NAME=PATH over a folder's
            self.adapters[adapter.name] = adapter

    @classmethod
    def from_settings(cls, lora_dirs: str, loras: str, cache_size: int = 8) -> "LoraRegistry":
        """`lora_dirs`: folders separated by ',' or os.pathsep; `loras`: NAME=PATH pairs separated by ','."""
        adapters = _in_folder(BUNDLED, bundled=True) if BUNDLED.is_dir() else []
        for folder in lora_folders(lora_dirs):
            if not Path(folder).is_dir():
                raise VidserveError(f"--lora-dir {folder}: no such folder")
            adapters += _in_folder(Path(folder), bundled=False)
        for pair in filter(None, (p.strip() for p in loras.split(","))):
            name, sep, path = pair.partition("=")
            if not sep or not name or not path:
                raise VidserveError(f"--lora takes NAME=PATH at start, got {pair!r}")
            adapters.append(read_adapter(name, Path(path)))
        return cls(adapters, cache_size)

    def get(self, name: str) -> Adapter | None:
        return self.adapters.get(name)

    def check_preset(self, preset: str, loras: tuple[LoraRequest, ...]) -> None:
        """A 400 naming `preset` and the file its first missing adapter needs, unless every
        adapter it applies is registered: before the checks of `check`, which name `loras`."""
        for lora in loras:
            if self.get(lora.name) is None:
                # The server's own folders are not the client's to see: the command names a placeholder.
                raise InvalidRequest(f"preset {echo(preset)}: {missing_adapter(lora.name, 'LORA_DIR')}",
                                     param="preset", code="adapter_missing")

    def check(self, loras: tuple[LoraRequest, ...], models: list[str], max_loras: int) -> None:
        """A 400 naming `loras` unless every adapter asked for is registered, fits each model the
        request runs on (a long video's continuation model too), and there are few enough."""
        if len(loras) > max_loras:
            raise InvalidRequest(f"loras: at most {max_loras} adapters per request, got {len(loras)}", param="loras")
        names = [lora.name for lora in loras]
        if len(set(names)) != len(names):
            raise InvalidRequest("loras: an adapter may be named once per request", param="loras")
        for lora in loras:
            adapter = self.get(lora.name)
            if adapter is None:
                known = ", ".join(sorted(self.adapters)) or "none"
                raise InvalidRequest(f"loras: unknown adapter {echo(lora.name)}; registered adapters: {known}",
                                     param="loras", code="lora_not_found")
            for model in models:
                if not adapter.fits(model):
                    raise InvalidRequest(f"loras: adapter {lora.name!r} is for {', '.join(adapter.base_models)}, "
                                         f"not {model}", param="loras")


class LoadedAdapters:
    """The adapters loaded on this process's pipelines: each pipeline's adapter cache publishes
    its names whenever they change. Held by weak reference, so a pipeline let go of no longer
    counts (nor is kept alive by this)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_pipeline: weakref.WeakKeyDictionary[object, frozenset[str]] = weakref.WeakKeyDictionary()

    def publish(self, pipeline: object, names: Iterable[str]) -> None:
        """`pipeline`'s adapters are now `names` (a pipeline's adapter cache: any object it owns)."""
        with self._lock:
            self._by_pipeline[pipeline] = frozenset(names)

    def names(self) -> frozenset[str]:
        """Every adapter loaded on any pipeline of this process."""
        with self._lock:
            return frozenset().union(*self._by_pipeline.values())


LOADED_ADAPTERS = LoadedAdapters()
