"""Server-wide settings: `VIDSERVE_*` environment variables, overridden by CLI flags."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from vidserve.options import AttentionOptions, CacheOptions, LoadOptions


# What --device and --dtype accept; pipelines/devices.py turns them into torch's.
DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?"
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VIDSERVE_", extra="ignore")

    data_dir: Path = Field(Path("./data"), description="Job database, outputs and exported models live here.")
    storage: str = Field("local", pattern=r"^(local|s3://[^/]+(/.*)?)$",
                         description="Where job files live: 'local' (data_dir/files) or 's3://BUCKET[/PREFIX]' "
                         "(credentials and region from the AWS_* variables).")
    s3_endpoint_url: str | None = Field(None, description="S3-compatible server for s3:// storage, e.g. "
                                        "http://minio:9000; unset: AWS.")
    content_redirect: bool = Field(False, description="Answer content downloads with 307 to a presigned storage "
                                   "URL instead of streaming them (s3:// storage; local storage still streams).")
    content_url_seconds: int = Field(3600, gt=0, le=7 * 24 * 3600, description="How long a presigned content URL "
                                     "works (S3 allows at most 7 days).")
    output_ttl: int = Field(7 * 24 * 3600, ge=0, description="Seconds a completed video's files are kept; then "
                            "they are deleted, its content answers 410, its record stays (0: kept until deleted).")
    expiry_sweep_seconds: float = Field(60.0, gt=0, description="How often the API looks for expired videos to "
                                        "delete.")
    default_model: str = Field("wan-shapes", description="Model used when a request names none.")
    model_dirs: str = Field("", description="Folders of diffusers model folders that requests may name as their "
                            "model (by folder name), separated by ',' or os.pathsep; registry names always work, "
                            "other paths never do (the CLI's --model still takes any folder).")
    device: str = Field("auto", pattern=f"^({DEVICE_PATTERN})$",
                        description="'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:N'.")
    dtype: str = Field("auto", pattern=f"^({'|'.join(DTYPE_NAMES)})$",
                       description="'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16', 'float16'.")

    # Request limits: anything past them is rejected before it reaches a model.
    max_prompt_chars: int = Field(10_000, gt=0, description="Longest prompt (and negative or per-chunk prompt).")
    max_seconds: float = Field(20.0, gt=0, description="Longest clip a request may ask for.")
    max_frames: int = Field(481, gt=0, description="Most frames a request may ask for (4k+1).")
    max_side: int = Field(1280, gt=0, description="Largest width or height in pixels.")
    max_steps: int = Field(100, gt=0, description="Most denoising steps a request may ask for.")
    lora_dirs: str = Field("", description="Folders whose LoRA adapters (.safetensors files, or folders holding "
                           "one) requests may name, separated by ',' or os.pathsep; the bundled adapters always work.")
    loras: str = Field("", description="More adapters, as NAME=PATH pairs separated by ','.")
    max_loras: int = Field(4, ge=0, le=16, description="Most adapters one request may use.")
    lora_cache: int = Field(8, ge=1, description="Adapters a worker keeps loaded per model, least recently used "
                            "dropped first.")
    max_image_pixels: int = Field(4096 * 4096, gt=0, description="Largest conditioning image (width*height).")
    max_upload_bytes: int = Field(20 * 1024 * 1024, gt=0, description="Largest uploaded file; any request body "
                                  "(JSON, form, chunked, chat) may be this plus 64 KiB, and is read no further.")
    max_queued: int = Field(100, gt=0, description="Queued jobs past which new ones get 429.")
    # Renditions (a request's `outputs`): each is encoded by the worker after the video is decoded.
    max_outputs: int = Field(8, ge=0, description="Most renditions one request may ask for.")
    max_output_side: int = Field(1920, ge=16, description="Largest width or height of a rendition in pixels.")
    max_output_frames: int = Field(1801, gt=0, description="Most frames one rendition may hold, after its frame "
                                   "rate conversion (the default: 30 s at 60 fps).")

    attention: AttentionOptions = Field(AttentionOptions(), description="Default attention; JSON, e.g. "
                                        '{"mode": "sparse", "density": 0.125}. Requests may override it.')

    cache: CacheOptions = Field(CacheOptions(), description="Default step caching; JSON, e.g. "
                                '{"kind": "first_block", "threshold": 0.05}. Requests may override it.')
    # How models load (see LoadOptions): per server, each combination loaded once.
    quantization: str = Field("none", pattern="^(none|int8|fp8)$", description="Weight-only quantization.")
    compile: bool = Field(False, description="Regional torch.compile of the transformer blocks, at load.")
    offload: str = Field("none", pattern="^(none|model|group|sequential)$", description="CPU offload (CUDA).")
    vae_tiling: bool = Field(False, description="Tiled VAE decoding.")

    # The LLM / vision chat path.
    chat_model: str = Field("vlm-shapes", description="Model for /v1/chat/completions and prompt extension "
                            "(a name, hub id or local folder); empty: no chat.")
    chat_max_running: int = Field(16, gt=0, description="Sequences decoded together (continuous batching).")
    chat_prefill_tokens: int = Field(256, gt=0, description="Prompt tokens a step prefills while more sequences "
                                     "decode than wait (8 times as many otherwise): how long a new prompt may delay "
                                     "running answers.")
    chat_kv_tokens: int | None = Field(None, gt=0, description="Tokens the chat KV cache holds, in blocks of 16 "
                                       "(running sequences and cached prefixes); default: the smaller of "
                                       "VIDSERVE_CHAT_MAX_RUNNING full contexts and half the memory free at start "
                                       "(logged).")
    chat_prefix_cache: bool = Field(True, description="Automatic prefix caching: prompts that begin like an earlier "
                                    "one (system prompt, conversation so far, same images) reuse its KV cache.")
    chat_prefix_sharing: str = Field("key", pattern="^(key|global)$", description="Whose cached prompts and image "
                                     "features a chat request may reuse: 'key', only its own API key's (or those "
                                     "of requests with the same cache_salt); 'global', everyone's (one tenant).")
    chat_max_waiting: int = Field(64, ge=0, description="Chat requests waiting for a slot past which new ones get 429.")
    chat_max_tokens: int = Field(4096, gt=0, description="Most tokens one answer may generate.")
    chat_max_vision_pixels: int = Field(4096 * 4096, gt=0, description="Largest image (width*height) the chat "
                                        "model's processor may scale a chat image to; larger ones are refused "
                                        "before it runs.")
    chat_remote_images: bool = Field(False, description="Fetch http(s) image URLs (public hosts only, unless "
                                     "allow_private_urls).")
    chat_url: str | None = Field(None, description="Chat endpoint distributed workers call for prompt extension "
                                 "and captions, e.g. http://api-host:8000/v1; embedded mode calls in-process.")

    # Queue and crash safety.
    queue: str = Field("embedded", pattern="^(embedded|celery)$", description="embedded (in-process) or celery.")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Broker and job store for --queue celery.")
    allow_volatile_redis: bool = Field(False, description="Start on a Redis without its append-only file (or one "
                                       "whose persistence cannot be checked), where a crash of Redis loses recent "
                                       "jobs and queue messages; otherwise the API and workers refuse to start.")
    queue_without_workers: bool = Field(False, description="--queue celery: accept jobs for a model no live worker "
                                        "holds and leave them queued (for fleets that start workers from the queue "
                                        "length); otherwise they get 503 model_unavailable.")
    lease_seconds: float = Field(30.0, gt=0, description="A running job whose worker is silent this long is lost.")
    max_attempts: int = Field(2, ge=1, description="Runs a job gets before a worker crash fails it.")
    shutdown_grace_seconds: float = Field(30.0, ge=0, description="How long a stopping server (its first Ctrl-C "
                                          "or SIGTERM) lets its running job finish before it gives the job back, "
                                          "to go on from its last finished chunk on the next start.")
    priority_aging_seconds: float = Field(600.0, gt=0, description="A job waiting this long counts one priority "
                                          "higher, so a low one is never starved by a stream of normal ones.")
    visibility_timeout: int = Field(6 * 3600, gt=0, description="Redis redelivery timeout; longer than any job.")
    warmup: bool = Field(True, description="Before it takes jobs (and, embedded, before /readyz says ready), a "
                         "worker runs one tiny generation of its model (embedded: the default model), so the first "
                         "job runs as fast as the next ones; off: the first job pays for the first calls.")

    # HTTP.
    host: str = Field("127.0.0.1", description="Address `vidserve serve` listens on; any but a loopback one "
                      "needs API keys (or --allow-unauthenticated).")
    api_keys: str = Field("", description="Comma-separated keys for 'Authorization: Bearer'; empty: no auth.")
    keys_file: Path | None = Field(None, description="TOML/JSON file of named keys: SHA-256, role, quotas "
                                   "(see vidserve/keys.py).")
    key_max_active_jobs: int = Field(20, ge=0, description="Queued + running jobs per API key, for keys "
                                     "that set none (0: unlimited).")
    key_requests_per_minute: int = Field(0, ge=0, description="Requests per minute per API key, for keys "
                                         "that set none (0: unlimited).")
    key_max_streams: int = Field(16, ge=0, description="Event streams (GET /v1/videos/ID/events) one API key "
                                 "may hold open in one API process, for keys that set none (0: unlimited).")
    metrics_address: str | None = Field(None, pattern=r"^\[?[^\s/]+\]?:[0-9]{1,5}$",
                                        description="HOST:PORT of a listener of its own serving /metrics without "
                                        "keys (for Prometheus on a private network); on the API's port, /metrics "
                                        "needs an admin key when there are keys.")
    stream_secret: str | None = Field(None, description="Key that signs stream URLs' tokens; every API process "
                                      "must share it. Unset: made and kept in data_dir.")
    stream_url_seconds: int = Field(3600, gt=0, le=7 * 24 * 3600, description="How long a video's stream URL "
                                    "works from when it is issued (on a server with keys); reloading the playlist "
                                    "never extends it.")
    stream_hold_seconds: float = Field(30.0, ge=0, le=600, description="How long a request for the stream "
                                       "playlist of a video with no segment yet is held for its first one, so a "
                                       "player started on a queued video waits instead of failing (0: answer at "
                                       "once).")
    event_keepalive_seconds: float = Field(15.0, gt=0, le=600, description="After how many quiet seconds an "
                                           "event stream (GET /v1/videos/ID/events) sends a comment line, so a proxy "
                                           "does not close it; streams read a job only when it changes.")
    realtime_max_seconds: float = Field(20.0, gt=0, description="Length of a realtime session that names no "
                                        "seconds, and the most one may ask for.")
    realtime_max_prompt_updates: int = Field(100, gt=0, description="Prompt updates one realtime session may send "
                                             "(each at most VIDSERVE_MAX_PROMPT_CHARS characters); past them, an "
                                             "error and the last prompt goes on.")
    webhook_url: str | None = Field(None, description="Default webhook for jobs that name none.")
    webhook_secret: str | None = Field(None, description="whsec_... signing secret; made and kept in data_dir if unset.")
    webhook_workers: int = Field(4, gt=0, description="Webhook deliveries in flight at once; each receiver still "
                                 "gets its events one at a time, in order.")
    allow_private_urls: bool = Field(False, description="Let webhook and chat image URLs reach loopback, private and "
                                     "link-local addresses (tests, trusted networks); off, they are refused with 400.")

    @property
    def load(self) -> LoadOptions:
        return LoadOptions(quantization=self.quantization, compile=self.compile, offload=self.offload,
                           vae_tiling=self.vae_tiling)

    @property
    def max_body_bytes(self) -> int:
        """Largest request body on any route: the largest upload, and room for a form's other fields."""
        return self.max_upload_bytes + 64 * 1024

    @property
    def model_directories(self) -> tuple[Path, ...]:
        return tuple(Path(d.strip()).expanduser() for d in re.split(f"[,{re.escape(os.pathsep)}]", self.model_dirs)
                     if d.strip())

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(k.strip() for k in self.api_keys.split(",") if k.strip())


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def settings_table() -> str:
    """docs/settings.md's table: every setting with its default and description, in the order
    declared (`python -m vidserve.config` prints it; a test checks docs/settings.md against it)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        rows.append(f"| `VIDSERVE_{name.upper()}` | {_shown(field.default)} | {field.description} |")
    return "\n".join(rows) + "\n"


def _shown(default: object) -> str:
    if default is None or default == "":
        return "—"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, BaseModel):  # options as JSON, by the field that picks the kind; the rest are its own
        first, value = next(iter(default.model_dump(mode="json").items()))
        return f'`{{"{first}": "{value}"}}`'
    return f"`{default}`"


if __name__ == "__main__":
    print(settings_table(), end="")
