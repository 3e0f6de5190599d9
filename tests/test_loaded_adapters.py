"""`LOADED_ADAPTERS`, what `/v1/loras` says is loaded: each pipeline's adapter cache publishes
its adapters as they load and unload, and a pipeline let go of no longer counts."""

from __future__ import annotations

import gc

import torch
from lora_files import random_lora

from vidserve.loras import LOADED_ADAPTERS, LoraRegistry, LoraRequest, read_adapter
from vidserve.pipelines.video import VideoPipeline
from vidserve.registry import MODELS


def test_pipelines_publish_what_they_load_and_unload(tmp_path):
    adapters = []
    for seed, name in enumerate(("published-a", "published-b"), 1):
        (tmp_path / name).mkdir()
        adapters.append(read_adapter(name, random_lora(tmp_path / name, seed=seed)))
    registry = LoraRegistry(adapters, cache_size=1)
    first = VideoPipeline.load(MODELS["wan-tiny"], torch.device("cpu"), torch.float32)
    second = VideoPipeline.load(MODELS["wan-tiny"], torch.device("cpu"), torch.float32)
    assert not {"published-a", "published-b"} & LOADED_ADAPTERS.names()
    first.adapters.use((LoraRequest(name="published-a"),), registry)
    second.adapters.use((LoraRequest(name="published-b"),), registry)
    assert {"published-a", "published-b"} <= LOADED_ADAPTERS.names()  # every pipeline's
    first.adapters.use((LoraRequest(name="published-b"),), registry)  # a cache of 1: "published-a" makes room
    assert "published-a" not in LOADED_ADAPTERS.names()
    second.adapters.unload_all()
    assert "published-b" in LOADED_ADAPTERS.names()  # still on the first
    del first
    gc.collect()
    assert not {"published-a", "published-b"} & LOADED_ADAPTERS.names()
