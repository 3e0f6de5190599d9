"""Wan video pipelines on diffusers (and, later, the LLM/VLM engine)."""

# Library chatter (loading bars, deprecation and backend notes) would bury our own
# progress bar and timings; real errors still surface as exceptions.
import diffusers.utils.logging as _diffusers_logging
import transformers.utils.logging as _transformers_logging

_transformers_logging.set_verbosity_error()
_transformers_logging.disable_progress_bar()
_diffusers_logging.set_verbosity_error()
_diffusers_logging.disable_progress_bar()
