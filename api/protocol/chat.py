"""The contract of /v1/chat/completions: OpenAI's request shape, plus vidserve's
`repetition_detection`, `prefix_cache`, `ignore_eos` (benchmarks) and vLLM's `cache_salt`.
Unsupported OpenAI fields are rejected by name rather than silently ignored. The sampling
fields are `vidserve/sampling.py` `SamplingOptions`, which the request extends; the messages
are `vidserve/chat.py`'s, which the engine's prompt is made from."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_serializer, model_validator

from vidserve.chat import Message
from vidserve.sampling import SamplingOptions

from .json_values import MAX_JSON_DEPTH, nesting_depth


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class JSONSchema(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict = Field(alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _shallow(cls, schema: dict) -> dict:  # the grammar compiler walks it recursively
        if nesting_depth(schema) > MAX_JSON_DEPTH:
            raise ValueError(f"nests deeper than {MAX_JSON_DEPTH} levels of lists and objects")
        return schema


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchema | None = None


class ChatCompletionCreate(SamplingOptions):
    """The request: the messages, the sampling options (`SamplingOptions`, declared once for the
    API and the engine), and what the API itself reads."""

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_completion_tokens: int | None = Field(None, ge=1, description="OpenAI's newer name for max_tokens; it "
                                              "wins when both are sent.")
    n: Literal[1] = 1
    response_format: ResponseFormat | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=256, description="Share the prefix cache "
                                   "with every request that sends this salt, whichever API key sends it, and with no "
                                   "other (as vLLM's): make it long and random, and tell only those who may share.")
    user: str | None = None

    @field_validator("response_format")
    @classmethod
    def _no_stop_inside_json(cls, response_format: ResponseFormat | None, info: ValidationInfo):
        # A stop string could end the answer mid-structure, and a JSON answer that stops must parse.
        if response_format is not None and response_format.type != "text" and info.data.get("stop"):
            raise ValueError("stop cannot be combined with a JSON response_format: a stop string could cut the "
                             "JSON short; leave stop out (the grammar ends the answer when the JSON is complete)")
        return response_format

    @model_validator(mode="after")
    def _one_answer_bound(self) -> ChatCompletionCreate:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self

    def format_dict(self) -> dict | None:
        return self.response_format.model_dump(by_alias=True, exclude_none=True) if self.response_format else None


# --- responses ---------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="Prompt tokens whose KV cache came from an earlier prompt that began "
                                           "the same way (automatic prefix caching).")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None
    stop_reason: str | None = Field(None, description="What stopped it, beyond OpenAI's finish_reason: a stop "
                                                      "string, or `repetition` (loop detection).")


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: None = None
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    """What a chunk adds: only the fields it carries are sent."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _only_what_it_carries(self, handler):
        return {name: value for name, value in handler(self).items() if value is not None}


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: str | None = None
    stop_reason: str | None = None

    @model_serializer(mode="wrap")
    def _stop_reason_once_finished(self, handler):
        data = handler(self)
        if self.finish_reason is None:
            del data["stop_reason"]
        return data


class ChatCompletionChunk(BaseModel):
    """One `data:` event of a streamed answer: `stop_reason` only with a finish_reason, and
    `usage` only when asked for (then null on every chunk but a last one with no choices)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
