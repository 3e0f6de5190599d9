"""Where a model runs: the torch device and dtype for a `--device` / `--dtype` setting, and
whether the load options can run there. Shared by the video and the LLM pipelines.

Every mistake here is a `VidserveError` with one line saying what to change, raised
before a model is loaded, so the CLI can check a command's settings up front.
"""

from __future__ import annotations

import re

import torch

from vidserve.config import DEVICE_PATTERN, DTYPE_NAMES
from vidserve.errors import VidserveError
from vidserve.options import LoadOptions

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES if name != "auto"}


def resolve_device(device: str) -> torch.device:
    if not re.fullmatch(DEVICE_PATTERN, device):
        raise VidserveError(f"device must be auto, cpu, cuda or cuda:N; got {device!r}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise VidserveError(f"device {device} asked for, but this machine has no CUDA GPU (use --device cpu)")
        if (resolved.index or 0) >= torch.cuda.device_count():
            raise VidserveError(f"device {device} asked for, but this machine has "
                                f"{torch.cuda.device_count()} CUDA device(s)")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[dtype]
    except KeyError:
        raise VidserveError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}") from None


def check_load(options: LoadOptions, device: torch.device) -> None:
    """Load options that need a GPU, refused on anything else."""
    if device.type == "cuda":
        return
    if options.offload != "none":
        raise VidserveError(f"offload={options.offload} moves weights between CPU and GPU memory; this runs on "
                            f"{device} (use --offload none)")
    if options.quantization == "fp8":
        raise VidserveError(f"fp8 weight-only quantization needs a CUDA GPU (Ada/Hopper or newer); this runs on "
                            f"{device} (use --quantization int8)")


def placement(device: str, dtype: str, options: LoadOptions = LoadOptions()) -> tuple[torch.device, torch.dtype]:
    """The device and dtype a model loads on, with the load options checked against them."""
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    check_load(options, torch_device)
    return torch_device, torch_dtype
