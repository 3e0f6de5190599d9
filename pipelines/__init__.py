"""Wan video pipelines on diffusers, and the LLM/VLM engine (`llm/`).

Importing them changes no process-wide logging or warning setting; the CLI's commands call
`quiet_libraries` for themselves."""

import logging


def quiet_libraries() -> None:
    """Library chatter (loading bars, deprecation and backend notes) would bury the CLI's own
    progress bar and timings; real errors still surface as exceptions. torchao (when installed,
    diffusers imports it) warns about CUDA-only extensions it cannot load. It sets the whole
    process's logging: for entry points, never for a library import."""
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import diffusers.utils.logging as diffusers_logging
    import transformers.utils.logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
