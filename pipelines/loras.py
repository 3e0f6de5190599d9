"""LoRA adapters on a resident pipeline, switched per request.

An adapter loads on first use through diffusers' Wan LoRA loader (`load_lora_weights`, which
also converts Kohya/musubi and lightx2v files), into both transformers of a two-expert model,
and stays loaded in a least-recently-used cache. Each request then sets which adapters are
active with which weights (`set_adapters`), per expert as its `target` says. A request
without adapters runs with them all disabled: PEFT's layers then call only the base layer,
so its frames are exactly the base model's, whatever ran before it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from diffusers import DiffusionPipeline

from vidserve.errors import VidserveError
from vidserve.loras import LOADED_ADAPTERS, LoraRegistry, LoraRequest


class LoraLoadFailed(VidserveError):
    code = "lora_load_failed"


@dataclass(frozen=True)
class LoraEvent:
    """One adapter a request used: loaded now (`seconds` it took) or found loaded."""

    name: str
    cached: bool
    seconds: float = 0.0


def _targets(target: str, expert: int, experts: int) -> bool:
    """Whether an adapter with this target applies to transformer `expert` (0: high noise)."""
    return experts == 1 or target == "both" or (target == "high") == (expert == 0)


class AdapterCache:
    """One pipeline's loaded adapters, at most the registry's `cache_size` (more only while one
    request needs them all)."""

    def __init__(self, pipe: DiffusionPipeline, transformers: list):
        self.pipe, self.transformers = pipe, transformers
        self._loaded: OrderedDict[str, str] = OrderedDict()  # name -> the file it was loaded from

    @property
    def loaded(self) -> list[str]:
        return list(self._loaded)

    def use(self, loras: tuple[LoraRequest, ...], registry: LoraRegistry) -> list[LoraEvent]:
        """Make exactly these adapters active, at their scales, for the next request."""
        events = [self._ensure(lora.name, registry, keep={lora.name for lora in loras}) for lora in loras]
        for expert, transformer in enumerate(self.transformers):
            active = [(lora.name, lora.scale) for lora in loras
                      if _targets(lora.target, expert, len(self.transformers))]
            if active:
                names, weights = zip(*active)
                transformer.set_adapters(list(names), list(weights))
                transformer.enable_adapters()
            elif self._loaded:
                transformer.disable_adapters()
        return events

    def _ensure(self, name: str, registry: LoraRegistry, keep: set[str]) -> LoraEvent:
        adapter = registry.get(name)
        if adapter is None:
            raise LoraLoadFailed(f"LoRA {name!r} is not registered on this worker (start it with --lora-dir or "
                                 "--lora NAME=PATH, as the API's)")
        if self._loaded.get(name) == str(adapter.path):
            self._loaded.move_to_end(name)
            return LoraEvent(name, cached=True)
        if name in self._loaded:  # re-registered from another file: load that one
            self._unload(name)
        while len(self._loaded) >= registry.cache_size:
            oldest = next((n for n in self._loaded if n not in keep), None)
            if oldest is None:
                break  # every loaded adapter is this request's: go over capacity for it
            self._unload(oldest)
        start = time.perf_counter()
        try:
            self.pipe.load_lora_weights(str(adapter.path), adapter_name=name)
            if len(self.transformers) > 1:
                self.pipe.load_lora_weights(str(adapter.path), adapter_name=name, load_into_transformer_2=True)
        except Exception as exc:
            self._forget(name)  # a partial load must not linger in the transformers
            raise LoraLoadFailed(f"LoRA {name!r} ({adapter.path.name}) could not be loaded: "
                                 f"{type(exc).__name__}: {exc}") from exc
        self._loaded[name] = str(adapter.path)
        LOADED_ADAPTERS.publish(self, self._loaded)
        return LoraEvent(name, cached=False, seconds=time.perf_counter() - start)

    def unload_all(self) -> None:
        """Take every adapter out, PEFT's layers included, leaving the base model as it loaded."""
        for transformer in self.transformers:
            if getattr(transformer, "peft_config", None):
                transformer.unload_lora()
        self._loaded.clear()
        LOADED_ADAPTERS.publish(self, self._loaded)

    def _unload(self, name: str) -> None:
        self._forget(name)
        self._loaded.pop(name, None)
        LOADED_ADAPTERS.publish(self, self._loaded)

    def _forget(self, name: str) -> None:
        for transformer in self.transformers:
            if name in getattr(transformer, "peft_config", {}):
                transformer.delete_adapters(name)

