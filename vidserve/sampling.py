"""How the LLM makes one answer, as a chat request asks: each sampling option declared once.

`SamplingOptions` is the chat request's part the engine reads. The API's request body
(`api/protocol/chat.py` `ChatCompletionCreate`) extends it, so the API takes a field declared
here, with its checks and description; the engine's `SamplingParams`
(`pipelines/llm/sequence.py`) extends it too and is built from it by copying every field, so
the field reaches the sampler without more code. Adding one: the field here, with a default and
a description, then its use in `pipelines/llm/sampler.py` (or wherever it takes effect), and its
row in `tests/test_chat_params.py` `WALK`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vidserve.options import RepetitionOptions

MAX_STOPS = 4


class SamplingOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(None, ge=1, description="The most tokens the answer may take (default: what "
                                   "the context leaves, at most the server's VIDSERVE_CHAT_MAX_TOKENS).")
    temperature: float = Field(1.0, ge=0, le=2, description="0: always the likeliest token (greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Sample from the smallest set of tokens holding this much "
                         "of the probability.")
    seed: int | None = Field(None, ge=0, lt=2**63, description="0 to 2^63-1, as for videos: the same seed, prompt "
                             "and options give the same answer, whatever it is batched with.")
    stop: str | list[str] | None = Field(None, validate_default=True, description=f"Up to {MAX_STOPS} strings "
                                         "that end the answer (not included in it).")
    repetition_detection: bool | RepetitionOptions = Field(True, description="Stop an answer that has collapsed "
                                                           "into repeating itself (stop_reason `repetition`).")
    ignore_eos: bool = Field(False, description="Benchmarks: go on past the end-of-text token, to max_tokens.")
    prefix_cache: bool = Field(True, description="Reuse the KV cache of a prompt that began the same way (and "
                               "offer this one's); false computes the whole prompt and shares nothing.")

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOPS or any(not s for s in stops):
            raise ValueError(f"stop takes up to {MAX_STOPS} non-empty strings")
        return stops

    @property
    def repetition(self) -> RepetitionOptions:
        if isinstance(self.repetition_detection, bool):
            return RepetitionOptions(enabled=self.repetition_detection)
        return self.repetition_detection
