"""What this server can run: `/v1/models` (OpenAI's model list, with the serving facts beside),
`/v1/loras` (the adapters a request may name) and the playground's `/playground/models` (which
models would take a job now)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from vidserve.loras import Adapter, LoraRequest
from vidserve.registry import ChatModelSpec, ModelSpec, Preset
from vidserve.vocabulary import PromptVocabulary


def _source(source: str) -> str:
    """Where a model's weights come from, naming no folder on this server: a hub id, "builtin",
    or "local" (the bundled models, folders on disk)."""
    return "local" if Path(source).is_absolute() else source


class PromptWords(BaseModel):
    """The prompts a model trained on one caption pattern reads: `language` text in the pattern of
    `examples`, built of these words; `synonyms` maps other words its tokenizer knows to the word
    each means."""

    language: str
    examples: list[str]
    colours: list[str]
    shapes: list[str]
    motions: list[str]
    backgrounds: list[str]
    synonyms: dict[str, str]

    @classmethod
    def of(cls, vocabulary: PromptVocabulary | None) -> PromptWords | None:
        if vocabulary is None:
            return None
        return cls(language=vocabulary.language, examples=list(vocabulary.examples), colours=list(vocabulary.colours),
                   shapes=list(vocabulary.shapes), motions=list(vocabulary.motions),
                   backgrounds=list(vocabulary.backgrounds), synonyms=dict(vocabulary.synonyms))


class ModelSizes(BaseModel):
    """The sizes a request may ask of a model here."""

    multiple: int = Field(description="Each side is a multiple of this.")
    max_side: int = Field(description="The longest side: what the model's position table covers, or this "
                                      "server's limit if lower.")
    trained: list[str] = Field(description="The sizes it was trained at (WIDTHxHEIGHT; none: random weights); "
                                           "far from these, a video gets an untrained_size warning.")


class ModelPreset(BaseModel):
    """Sampling settings that go together; a request naming the preset gets these, and its own
    fields still override them."""

    name: str
    num_inference_steps: int
    guidance_scale: float
    flow_shift: float | None = Field(description="null: the model's.")
    loras: list[LoraRequest]
    description: str

    @classmethod
    def of(cls, name: str, preset: Preset) -> ModelPreset:
        return cls(name=name, num_inference_steps=preset.steps, guidance_scale=preset.guidance,
                   flow_shift=preset.flow_shift, loras=list(preset.loras), description=preset.description)


class VideoModel(BaseModel):
    """A video model: OpenAI's model fields, then what a request to it may ask."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "vidserve"
    kind: Literal["t2v", "i2v", "ti2v"] = Field(description="t2v: text only; i2v: needs a first frame; ti2v: "
                                                             "text, with an optional first frame.")
    size: str = Field(description="Its native size, WIDTHxHEIGHT: a request naming no size gets it.")
    sizes: ModelSizes
    fps: int
    frames_per_chunk: int
    source: str = Field(description="A Hugging Face Hub id, builtin, or local (a folder on this server).")
    description: str
    presets: list[ModelPreset]
    understands: PromptWords | None = Field(description="null: any text.")

    @classmethod
    def of(cls, spec: ModelSpec, max_side: int) -> VideoModel:
        """`max_side`: this server's limit on a side."""
        sizes = ModelSizes(multiple=spec.size_multiple, max_side=min(spec.max_side, max_side),
                           trained=[f"{width}x{height}" for width, height in spec.trained_sizes])
        return cls(id=spec.name, kind=spec.kind, size=f"{spec.width}x{spec.height}", sizes=sizes, fps=spec.fps,
                   frames_per_chunk=spec.frames_per_chunk, source=_source(spec.source),
                   description=spec.description, presets=[ModelPreset.of(name, p) for name, p in spec.presets],
                   understands=PromptWords.of(spec.understands))


class ChatModel(BaseModel):
    """The chat model this server runs, for /v1/chat/completions."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "vidserve"
    kind: Literal["chat"] = "chat"
    vision: bool = Field(description="Whether messages may carry images.")
    source: str = Field(description="A Hugging Face Hub id, builtin, or local (a folder on this server).")
    description: str
    understands: PromptWords | None = Field(description="null: any text.")

    @classmethod
    def of(cls, spec: ChatModelSpec) -> ChatModel:
        return cls(id=spec.name, vision=spec.vision, source=_source(spec.source), description=spec.description,
                   understands=PromptWords.of(spec.understands))


class ModelList(BaseModel):
    """GET /v1/models: the video models this server can run, then the chat model it runs (if any)."""

    object: Literal["list"] = "list"
    data: list[VideoModel | ChatModel]


class LoraAdapter(BaseModel):
    """A registered LoRA adapter, which a request names in `loras`."""

    id: str
    object: Literal["lora"] = "lora"
    base_models: list[str] = Field(description="The models it fits; empty: not stated, so any.")
    rank: int | None
    size_bytes: int
    description: str
    recommended_preset: str | None
    loaded: bool | None = Field(description="Whether this process has it loaded; null where the workers are "
                                            "other processes (not known here).")

    @classmethod
    def of(cls, adapter: Adapter, loaded: bool | None) -> LoraAdapter:
        return cls(id=adapter.name, base_models=list(adapter.base_models), rank=adapter.rank,
                   size_bytes=adapter.size_bytes, description=adapter.description,
                   recommended_preset=adapter.recommended_preset, loaded=loaded)


class LoraList(BaseModel):
    """GET /v1/loras."""

    object: Literal["list"] = "list"
    data: list[LoraAdapter]


class ModelAvailability(BaseModel):
    """Whether a job for a registry model would be taken now."""

    id: str
    available: bool
    reason: str | None = Field(description="Why a job for it would be refused now, and what to do about it; "
                                           "null: it would not be.")


class ModelAvailabilityList(BaseModel):
    """GET /playground/models: each registry model's availability, and the model a request that
    names none gets."""

    object: Literal["list"] = "list"
    default_model: str
    data: list[ModelAvailability]
