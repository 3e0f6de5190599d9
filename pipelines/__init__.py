"""Wan video pipelines on diffusers, and the LLM/VLM engine (`llm/`)."""

# Library chatter (loading bars, deprecation and backend notes) would bury our own
# progress bar and timings; real errors still surface as exceptions. torchao (when
# installed, diffusers imports it) warns about CUDA-only extensions it cannot load.
import logging as _logging

for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)

import diffusers.utils.logging as _diffusers_logging  # noqa: E402
import transformers.utils.logging as _transformers_logging  # noqa: E402

_transformers_logging.set_verbosity_error()
_transformers_logging.disable_progress_bar()
_diffusers_logging.set_verbosity_error()
_diffusers_logging.disable_progress_bar()
