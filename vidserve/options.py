"""What a request may ask for beyond its prompt, model, length and first frame.

`GenerationOptions` declares each such field once: the API's request bodies extend it, the
CLI's `generate` flags are made from it, and `vidserve.video_request.build_request` resolves it
into the request a pipeline runs and a job stores. The option groups it holds (attention,
step caching) have a server default (`VIDSERVE_ATTENTION` as JSON) that a request may override
field by field. Plain data, validated here so the API and CLI reject bad values before a
model sees them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vidserve.loras import LoraRequest
from vidserve.priorities import Priority


# The largest key tile the Triton kernel runs on a GPU (and its default query tile, twice as
# tall, the largest query tile): vidserve/kernels/support.py builds its table from this, and
# tests/test_triton_sm90.py compiles it for sm_90 and sm_80 to check that it fits.
MAX_TILE_TOKENS = 64


class AttentionOptions(BaseModel):
    """Self-attention over the video tokens: dense, or training-free block-sparse over 3D tiles.

    Text (and image) cross-attention always stays dense.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["dense", "sparse"] = Field("dense", description="'sparse': block-sparse over 3D tiles, keeping the "
                                            "key tiles `selection` picks ('topk' is read as 'sparse').")
    density: float = Field(0.125, gt=0, le=1, description="Share of key tiles each query tile keeps; with "
                           "selection 'mass', the most kept on average over all query tiles and heads.")
    # "topk" by default: no "mass" setting beats it on every input family of
    # benchmarks/attention.py (RESULTS: "Defaults by the worst case over input families").
    selection: Literal["topk", "mass"] = Field(
        "topk", description="How many key tiles each query tile keeps: 'topk' the same share everywhere; "
        "'mass' per query tile and head, enough for `mass` of the estimated attention, within "
        "[min_density, max_density] and the `density` total.")
    mass: float = Field(0.6, gt=0, le=1, description="selection 'mass': share of a query tile's estimated "
                        "attention (softmax over pooled tile scores) its kept key tiles must hold.")
    min_density: float = Field(0.08, gt=0, le=1, description="selection 'mass': share of key tiles every query "
                               "tile keeps at least (above `density` it overrides the `density` total).")
    max_density: float = Field(0.25, gt=0, le=1, description="selection 'mass': share of key tiles any query "
                               "tile keeps at most.")
    tile: tuple[int, int, int] = Field((4, 4, 4), description="(frames, height, width) tokens per tile.")
    neighbours: int = Field(0, ge=0, le=8, description="Key tiles within this radius of a query tile are always kept.")
    sink: bool = Field(False, description="Always keep the first frame's tiles.")
    dense_steps: int = Field(0, ge=0, description="The first denoising steps run dense (layout forms early).")
    dense_layers: int = Field(0, ge=0, description="The first transformer blocks run dense.")
    # Below ~1k tokens tiling and selection cost more than the attention they skip (measured in
    # benchmarks/RESULTS.md, "Block-sparse attention on CPU", "Small grids"), and a few tiles
    # leave top-k no choice worth making.
    min_tokens: int = Field(1024, ge=0, description="A forward pass over fewer video tokens runs dense: "
                            "sparsity saves nothing there (0: always sparse).")

    @field_validator("mode", mode="before")
    @classmethod
    def _topk_means_sparse(cls, mode):
        # "topk" named the sparse mode when top-k was its only selection; clients and stored jobs still send it.
        return "sparse" if mode == "topk" else mode

    @field_validator("tile")
    @classmethod
    def _tile_in_range(cls, tile: tuple[int, int, int]) -> tuple[int, int, int]:
        if any(not 1 <= t <= 16 for t in tile):
            raise ValueError("tile sizes must be between 1 and 16 tokens")
        if tile[0] * tile[1] * tile[2] > MAX_TILE_TOKENS:
            # Refused everywhere, also on CPU workers: the API cannot know which worker runs a job.
            raise ValueError(f"a tile may hold at most {MAX_TILE_TOKENS} tokens (its query tile twice that), "
                             f"the most the GPU kernel runs; {tile} holds {tile[0] * tile[1] * tile[2]}")
        return tile

    @model_validator(mode="after")
    def _density_bounds_ordered(self) -> AttentionOptions:
        if self.min_density > self.max_density:
            raise ValueError("min_density must not exceed max_density")
        return self


class CacheOptions(BaseModel):
    """Step caching: reuse transformer work across denoising steps, through diffusers' hooks.

    `first_block`: each step runs the first block; while its output changes less than
    `threshold` (relative) from the step that ran in full, the other blocks' residual is
    reused. `taylorseer`: full steps every `interval` steps after `warmup_steps`; the
    steps between skip the blocks and predict the output from a Taylor expansion.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["none", "first_block", "taylorseer"] = "none"
    threshold: float = Field(0.05, gt=0, le=1, description="first_block: change below which a step is reused.")
    interval: int = Field(3, ge=1, le=50, description="taylorseer: a full step every `interval` steps.")
    warmup_steps: int = Field(2, ge=0, le=100, description="taylorseer: the first steps always run in full.")


class LoadOptions(BaseModel):
    """How a model is loaded: fixed for as long as it stays loaded, so set per server (or
    per CLI run), never per request. Each combination is loaded once and kept."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quantization: Literal["none", "int8", "fp8"] = Field(
        "none", description="Weight-only quantization of the transformer's blocks (torchao); fp8 needs CUDA.")
    compile: bool = Field(False, description="Regional torch.compile of the transformer blocks.")
    offload: Literal["none", "model", "group", "sequential"] = Field(
        "none", description="Keep weights in CPU memory and move them to the GPU as needed (CUDA only).")
    vae_tiling: bool = Field(False, description="Decode the video in tiles: less memory, for big frames.")


class RepetitionOptions(BaseModel):
    """Loop detection for the LLM path: stop a generation that has collapsed into repeating itself.

    Collapse ("S S S S ...") usually comes from a software or kernel fault, not the
    weights, and at any temperature; a production endpoint cuts it short instead of
    burning the whole token budget. Characters that legitimately repeat (table rules,
    indentation, and digits: 10000 and 0.0001 are numbers, not loops) are exempt.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    token_repeats: int = Field(4, ge=2, le=1000, description="Stop once one token occurs this many times in a row.")
    ngram_max: int = Field(8, ge=0, le=64, description="Longest repeating pattern checked, in tokens (0: none).")
    ngram_repeats: int = Field(4, ge=2, le=100, description="Stop once a 2..ngram_max token pattern repeats this often.")
    exempt: str = Field(" \t\r\n-=|_*~#.0123456789",
                        description="Tokens made only of these characters may repeat.")


class QueueOptions(BaseModel):
    """Where a job waits, which every job request (create, extension, remix, realtime session) may say."""

    priority: Priority = Field("normal", description="'low', 'normal' or 'high': among jobs waiting for the same "
                               "workers, higher ones start first (a running job is never stopped); at most the "
                               "key's max_priority. A remix that names none keeps its source's.")


class GenerationOptions(QueueOptions):
    """The options of one video, as asked: unset ones take the model's or the server's default.

    A field added here reaches the API (both request bodies, JSON and multipart), the CLI (a
    flag of its name, unless `vidserve/cli.py` spells it its own way), the job record and the
    worker's request without more code; `build_request` resolves it where its default depends
    on the model or the server. The API spells two fields the diffusers way (its aliases)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    negative_prompt: str | None = Field(None, description="What the video should not show.")
    seed: int | None = Field(None, description="Random seed, for a repeatable video (default: a random one).")
    steps: int | None = Field(None, alias="num_inference_steps", description="Denoising steps (default: the model's).")
    guidance: float | None = Field(None, alias="guidance_scale",
                                   description="Classifier-free guidance scale (default: the model's).")
    prompts: list[str] | None = Field(None, description="Per-chunk prompts of a long video (a storyboard); chunks "
                                      "past the list use `prompt`.")
    drift_correction: Literal["color", "none"] = Field("color", description="Match each chunk's colours to the "
                                                       "first chunk made from its prompt.")
    prompt_extend: bool = Field(False, description="The LLM rewrites the prompt (seeing the image) first.")
    caption_chain: bool = Field(False, description="Each continuation chunk's prompt gets a caption of its "
                                "opening frame.")
    attention: dict[str, Any] | None = Field(None, description="AttentionOptions; unset fields keep the server's.")
    cache: dict[str, Any] | None = Field(None, description="CacheOptions (step caching); unset fields keep the "
                                         "server's.")
    loras: list[LoraRequest] | None = Field(None, max_length=16, description="LoRA adapters by registered name "
                                            "(GET /v1/loras), with their scale and, on a two-expert model, target.")
    preset: str | None = Field(None, max_length=64, description="One of the model's presets (GET /v1/models, `vidserve "
                               "models`): it fills steps, guidance, the sampler's shift and adapters left unset.")
