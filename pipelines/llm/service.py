"""The chat path's one entry: `ChatService` prepares a call (OpenAI messages to the model's
prompt, the answer bounded by the server's limits, the sampling parameters built from the
request's `SamplingOptions`, the grammar of a structured output), then streams or generates it
on the resident LLM engine, whose `check_fits` is the one check that prompt and answer fit its
context. The chat API and the video path's prompt writer both call it, so a call is prepared
one way.

The service also decides whose prefix cache a call uses (its cache salt): by default each API
key its own, so no key learns from `cached_tokens` or from time to first token whether
another key sent a prompt or an image; a request's `cache_salt` shares with whoever sends the
same salt; with `VIDSERVE_CHAT_PREFIX_SHARING=global` or on a server without keys, all calls
share one cache. The video path's own calls come with no key: they share the unsalted cache."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from vidserve.chat import Message, to_model_messages
from vidserve.config import Settings
from vidserve.errors import InvalidRequest
from vidserve.sampling import SamplingOptions

from .engine import LLMEngine
from .prompt import Prompt
from .sequence import Output, SamplingParams


@dataclass(frozen=True)
class ChatCall:
    """A call ready for the engine: everything that could reject it has been checked."""

    prompt: Prompt
    params: SamplingParams
    grammar: object | None = None  # the compiled response_format; None: free text


class ChatService:
    def __init__(self, engine: LLMEngine, settings: Settings):
        self.engine, self.settings = engine, settings

    @property
    def name(self) -> str:
        return self.engine.model.spec.name

    @property
    def vision(self) -> bool:
        return self.engine.model.vision

    def start(self) -> None:
        self.engine.start()

    def stop(self) -> None:
        self.engine.stop()

    def prepare(self, messages: list[Message], options: SamplingOptions, *, response_format: dict | None = None,
                tenant: str | None = None, cache_salt: str | None = None, from_client: bool = True) -> ChatCall:
        """Decode the images, apply the chat template, bound the answer, compile the grammar.

        A client's images are held to the server's limits (size, bytes, remote fetching, the
        pixels the model's processor would scale them to); the video path's own frames
        (`from_client=False`) only to the model's. `options` may be the request body itself
        (it extends them); `tenant` is the API key's name (None: a server without keys),
        `cache_salt` the request's."""
        model, settings = self.engine.model, self.settings
        if from_client:
            converted, images = to_model_messages(
                messages, max_pixels=settings.max_image_pixels, max_bytes=settings.max_upload_bytes,
                remote_images=settings.chat_remote_images, allow_private_urls=settings.allow_private_urls,
                check_image=lambda image: model.check_image(image, settings.chat_max_vision_pixels))
        else:
            converted, images = to_model_messages(messages, max_pixels=2**31, max_bytes=2**31, remote_images=False)
        prompt = model.encode(converted, images)
        if options.max_tokens is not None and options.max_tokens > settings.chat_max_tokens:
            raise InvalidRequest(f"max_tokens is {options.max_tokens}; this server allows at most "
                                 f"{settings.chat_max_tokens}", param="max_tokens")
        # Unbounded, an answer may take what the context leaves: at least a token, which the engine's
        # context check refuses when the prompt leaves none.
        max_tokens = options.max_tokens or max(1, min(self.engine.room(prompt), settings.chat_max_tokens))
        params = SamplingParams.of(options, max_tokens=max_tokens, cache_salt=self._salt(tenant, cache_salt))
        return ChatCall(prompt, params, self.engine.grammars.compile(response_format))

    def _salt(self, tenant: str | None, cache_salt: str | None) -> bytes:
        # Prefixed by kind, so no request's cache_salt can name a key's own cache.
        if cache_salt is not None:
            return b"salt:" + cache_salt.encode("utf-8", "surrogatepass")
        if tenant is not None and self.settings.chat_prefix_sharing == "key":
            return b"key:" + tenant.encode()
        return b""

    def stream(self, call: ChatCall) -> AsyncIterator[Output]:
        """Outputs as the engine makes them; closing the iterator aborts the call."""
        return self.engine.stream(call.prompt, call.params, call.grammar)

    def generate(self, call: ChatCall, timeout: float | None = None) -> tuple[str, Output]:
        """Blocking: the whole answer and the final output."""
        return self.engine.generate(call.prompt, call.params, call.grammar, timeout=timeout)
