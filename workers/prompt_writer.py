"""The video path asking the LLM path for words: a richer prompt before a job
(`prompt_extend`), and a caption of the frame each continuation chunk starts from
(`caption_chain`). Embedded servers call their engine in-process; Celery workers call
the chat endpoint at `VIDSERVE_CHAT_URL`. Both speak OpenAI chat messages."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import httpx
from PIL import Image

from vidserve.chat import ImagePart, ImageURL, Message, TextPart, data_url
from vidserve.sampling import SamplingOptions

if TYPE_CHECKING:
    from vidserve.pipelines.llm.service import ChatService

EXTEND = ("You write prompts for a text-to-video model. Rewrite the user's idea as one vivid paragraph: "
          "subject, action, setting, light, camera movement. Keep everything they asked for and contradict "
          "nothing. Answer with the prompt only.")
EXTEND_FROM_IMAGE = EXTEND + " The video starts from the attached image: describe what it shows and how it moves."
CAPTION = "Describe this video frame in one sentence: who or what is in it, what they are doing, and where."
TEMPERATURE = 0.7


class PromptWriter(ABC):
    max_tokens = 200

    @property
    @abstractmethod
    def vision(self) -> bool:
        """Whether the chat model sees images (a text-only LLM extends from the words alone)."""

    @abstractmethod
    def complete(self, messages: list[Message], seed: int) -> str:
        """The assistant's answer to OpenAI-shaped messages."""

    def sampling(self, seed: int) -> SamplingOptions:
        return SamplingOptions(max_tokens=self.max_tokens, temperature=TEMPERATURE, seed=seed)

    def extend(self, prompt: str, image: Image.Image | None, seed: int) -> str:
        content: list[TextPart | ImagePart] = [TextPart(type="text", text=prompt)]
        if image is not None and self.vision:
            content.append(_image_part(image))
        system = EXTEND_FROM_IMAGE if len(content) > 1 else EXTEND
        answer = self.complete([Message(role="system", content=system), Message(role="user", content=content)], seed)
        return answer.strip() or prompt

    def caption(self, image: Image.Image, seed: int) -> str:
        if not self.vision:
            raise RuntimeError("caption_chain needs a vision-language chat model; this one reads text only")
        content = [_image_part(image), TextPart(type="text", text=CAPTION)]
        return self.complete([Message(role="user", content=content)], seed).strip()


def _image_part(image: Image.Image) -> ImagePart:
    return ImagePart(type="image_url", image_url=ImageURL(url=data_url(image)))


class EngineWriter(PromptWriter):
    """In-process: the server's own chat service (embedded mode)."""

    def __init__(self, chat: ChatService, timeout: float = 300):
        self.chat, self.timeout = chat, timeout

    @property
    def vision(self) -> bool:
        return self.chat.vision

    def complete(self, messages: list[Message], seed: int) -> str:
        call = self.chat.prepare(messages, self.sampling(seed), from_client=False)
        text, out = self.chat.generate(call, timeout=self.timeout)
        if out.finish_reason == "error":
            raise RuntimeError(f"the chat model failed: {out.error}")
        return text


class HTTPWriter(PromptWriter):
    """Remote: the chat endpoint of a vidserve API server (Celery workers)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 300):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)
        self._model: dict | None = None

    @property
    def vision(self) -> bool:
        return bool(self._chat_model().get("vision"))

    def _chat_model(self) -> dict:
        if self._model is None:
            models = self._call("GET", "/models")["data"]
            chat = [m for m in models if m.get("kind") == "chat"]
            if not chat:
                raise RuntimeError(f"{self.client.base_url} serves no chat model")
            self._model = chat[0]
        return self._model

    def complete(self, messages: list[Message], seed: int) -> str:
        body = {"model": self._chat_model()["id"], "messages": [m.model_dump(exclude_none=True) for m in messages],
                **self.sampling(seed).model_dump(exclude_unset=True)}
        return self._call("POST", "/chat/completions", json=body)["choices"][0]["message"]["content"] or ""

    def _call(self, method: str, path: str, **kwargs) -> dict:
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"chat endpoint {self.client.base_url} unreachable: {exc}") from exc
        if response.status_code != 200:
            raise RuntimeError(f"chat endpoint {self.client.base_url}{path} answered {response.status_code}: "
                               f"{response.text[:300]}")
        return response.json()
