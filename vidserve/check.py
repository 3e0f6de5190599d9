"""`vidserve check`: what a deployment needs, verified before anything is started on it, one
line each: Redis reachable and durable, storage readable and writable, models resolvable,
presets' adapters registered, device and dtype usable. Nothing is loaded onto a device."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from vidserve.config import Settings
from vidserve.errors import ModelUnavailable, VidserveError
from vidserve.options import LoadOptions

# pipelines.devices.placement, passed in by the CLI: this core module may not import the pipelines.
Placement = Callable[[str, str, LoadOptions], tuple]


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAIL':<4} {self.name}: {self.detail}"


def run_checks(settings: Settings, models: Iterable[str], place: Placement, redis: bool,
               presets: Iterable[tuple[str, str]] = ()) -> list[Result]:
    """Every check, in order; `redis` says whether this deployment uses Redis; `presets` are
    (model, preset) pairs whose adapters must be registered."""
    checks = [("redis", lambda: _redis(settings))] if redis else []
    checks.append(("storage", lambda: _storage(settings)))
    checks += [(f"model {name}", lambda name=name: _model(name)) for name in dict.fromkeys(models)]
    checks += [(f"preset {model} {preset}", lambda model=model, preset=preset: _preset(settings, model, preset))
               for model, preset in dict.fromkeys(presets)]
    checks.append(("device", lambda: _device(settings, place)))
    return [attempt(name, check) for name, check in checks]


def attempt(name: str, check: Callable[[], str]) -> Result:
    try:
        return Result(name, True, check())
    except VidserveError as exc:
        return Result(name, False, str(exc))
    except Exception as exc:  # a check reports what went wrong, whatever it is, and the next one still runs
        return Result(name, False, f"{type(exc).__name__}: {exc}")


def _redis(settings: Settings) -> str:
    from vidserve.jobs.redis_persistence import aof_enabled, problem, shown

    enabled = aof_enabled(settings.redis_url)
    if enabled:
        return f"{shown(settings.redis_url)} is reachable and writes its append-only file"
    if not settings.allow_volatile_redis:
        raise VidserveError(problem(settings.redis_url, enabled))
    return f"{shown(settings.redis_url)} is reachable, not known to be durable (allowed: allow_volatile_redis)"


def _storage(settings: Settings) -> str:
    from vidserve.storage import open_storage

    storage = open_storage(settings)
    if settings.storage != "local" and _bucket_missing(storage):
        raise VidserveError(f"{storage.location}: bucket {storage.bucket!r} does not exist: create it, or name an "
                            "existing one in --storage")
    try:
        storage.probe()
    except Exception as exc:
        raise VidserveError(f"{storage.location}: {type(exc).__name__}: {exc}") from None
    return f"{storage.location} is readable and writable"


def _bucket_missing(storage) -> bool:
    """Whether an S3 storage's bucket is missing: asked on its own, because some S3-compatible
    servers (SeaweedFS) create a missing bucket on the first write, hiding a mistyped name."""
    from botocore.exceptions import ClientError

    try:
        storage.client.head_bucket(Bucket=storage.bucket)
    except ClientError as exc:
        # Only a 404 means no such bucket; anything else (no permission to ask, say) is the probe's to judge.
        return exc.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket")
    return False


def _model(name: str) -> str:
    from vidserve.registry import resolve_local

    spec = resolve_local(name)
    if spec.builtin:
        return "built in"
    if Path(spec.source).is_dir():
        return f"local folder {spec.source}"
    return _hub_weights(spec.source)


def _hub_weights(repo: str) -> str:
    """Where a hub model's weights would come from: the local cache, or a download."""
    from vidserve.registry import cached_snapshot

    folder = cached_snapshot(repo)
    return _downloadable(repo) if folder is None else f"{repo} is in the local cache at {folder}"


def _downloadable(repo: str) -> str:
    from huggingface_hub import HfApi

    try:
        HfApi().model_info(repo)
    except Exception:  # offline, unreachable, no such repository, or not allowed
        raise ModelUnavailable(repo) from None
    return f"{repo} is not cached; it downloads from the Hugging Face Hub on first use"


def _preset(settings: Settings, model: str, name: str) -> str:
    """Where each adapter the preset applies is registered from; failing, in one line, what
    each missing one needs and the command that fetches it into the first lora dir."""
    from vidserve.loras import PUBLIC_ADAPTERS, LoraRegistry, lora_folders, missing_adapter
    from vidserve.registry import resolve_local

    preset = resolve_local(model).preset(name)
    adapters = LoraRegistry.from_settings(settings.lora_dirs, settings.loras, settings.lora_cache)
    missing = [lora.name for lora in preset.loras if adapters.get(lora.name) is None]
    if missing:
        folders = lora_folders(settings.lora_dirs)
        folder = folders[0] if folders else "loras"
        fetched = any(adapter in PUBLIC_ADAPTERS for adapter in missing)
        then = f", and register the folder: --lora-dir {folder}" if fetched and not folders else ""
        raise VidserveError("; ".join(missing_adapter(adapter, folder) for adapter in missing) + then)
    found = [f"{lora.name} is {adapters.get(lora.name).path}" for lora in preset.loras]
    return "; ".join(found) or "applies no adapter"


def _device(settings: Settings, place: Placement) -> str:
    device, dtype = place(settings.device, settings.dtype, settings.load)
    return f"{device}, {str(dtype).removeprefix('torch.')} (from --device {settings.device} --dtype {settings.dtype})"
