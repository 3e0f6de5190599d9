"""/v1/chat/completions: OpenAI's Chat Completions on the LLM engine — images as
`image_url` parts, streaming as `chat.completion.chunk` events, structured outputs,
loop detection, the prefix cache's reuse as `usage.prompt_tokens_details.cached_tokens`
(each API key's own cache, unless a `cache_salt` or the server says otherwise).
Bad input is a 400 before anything reaches the model (images included: their size, shape
and the size the model's processor would scale them to); a full engine is a 429; a client
that goes away frees its batch slot, also while its images are encoded or its prompt
prefilled."""

from __future__ import annotations

import asyncio
import secrets
import time

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from vidserve.errors import EngineOverloaded
from vidserve.keys import Caller

from ..auth import authenticate
from ..protocol.chat import (AssistantMessage, ChatCompletion, ChatCompletionChunk, ChatCompletionCreate, Choice,
                            ChunkChoice, Delta, PromptTokensDetails, Usage)
from ..errors import APIError
from ..forms import unicode_json_body
from ..protocol.errors import ErrorDetail, ErrorResponse, errors
from ..protocol.media import CHAT_EVENTS
from ..services import Services, services

router = APIRouter(prefix="/v1/chat/completions", tags=["chat"],
                   dependencies=[Depends(authenticate), Depends(unicode_json_body)])

DISCONNECT_POLL_SECONDS = 0.5


@router.post("", response_model=ChatCompletion, responses={**CHAT_EVENTS, **errors(404)})
async def create_chat_completion(body: ChatCompletionCreate, request: Request, svc: Services = Depends(services),
                                 caller: Caller = Depends(authenticate)):
    chat = svc.chat
    if chat is None:
        raise APIError(404, "this server runs no chat model (VIDSERVE_CHAT_MODEL is empty)", code="model_not_found")
    if body.model not in (None, chat.name):
        raise APIError(404, f"chat model {body.model!r} is not served here; this server runs {chat.name!r}",
                       param="model", code="model_not_found")
    call = await run_in_threadpool(chat.prepare, body.messages, body, response_format=body.format_dict(),
                                   tenant=caller.name, cache_salt=body.cache_salt)
    completion = {"id": f"chatcmpl-{secrets.token_hex(12)}", "created": int(time.time()), "model": chat.name}
    outputs = chat.stream(call)
    try:  # admission errors surface with the first output, as an HTTP status
        first = await _unless_disconnected(request, outputs, anext(outputs))
    except EngineOverloaded as exc:
        raise APIError(429, str(exc), code="engine_overloaded", headers={"Retry-After": "1"}) from None
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_events(completion, first, outputs, include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await _complete(request, completion, first, outputs)


async def _complete(request: Request, completion: dict, first, outputs) -> ChatCompletion:
    async def collect():
        out, parts = first, [first.text]
        while not out.finished:
            out = await anext(outputs)
            parts.append(out.text)
        return "".join(parts), out

    text, last = await _unless_disconnected(request, outputs, collect())
    _raise_if_failed(last)
    choice = Choice(message=AssistantMessage(content=text), finish_reason=last.finish_reason,
                    stop_reason=last.stop_reason)
    return ChatCompletion(**completion, choices=[choice], usage=_usage(last))


async def _unless_disconnected(request: Request, outputs, work):
    """Await `work` (which reads `outputs`); if the client goes away first, close `outputs`,
    which aborts the sequence at the engine's next step, wherever it stands: waiting, images
    being encoded, prompt being prefilled, or decoding."""
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            await asyncio.wait({task})  # the generator must be idle before it can be closed
            await outputs.aclose()
            raise APIError(499, "client disconnected")
    return task.result()


async def _events(completion: dict, first, outputs, include_usage: bool):
    def chunk(choices: list[ChunkChoice], usage: Usage | None = None) -> str:
        body = ChatCompletionChunk(**completion, choices=choices, usage=usage)
        return f"data: {body.model_dump_json(exclude=None if include_usage else {'usage'})}\n\n"

    yield chunk([ChunkChoice(delta=Delta(role="assistant", content=""))])
    out = first
    while True:
        if out.finish_reason == "error":
            error = ErrorDetail(message=f"generation failed: {out.error}", type="server_error", param=None,
                                code="generation_failed")
            yield f"data: {ErrorResponse(error=error).model_dump_json()}\n\n"
            break
        if out.text:
            yield chunk([ChunkChoice(delta=Delta(content=out.text))])
        if out.finished:
            yield chunk([ChunkChoice(delta=Delta(), finish_reason=out.finish_reason, stop_reason=out.stop_reason)])
            if include_usage:  # OpenAI's last chunk: no choices, the usage
                yield chunk([], _usage(out))
            break
        out = await anext(outputs)
    yield "data: [DONE]\n\n"


def _usage(out) -> Usage:
    return Usage(prompt_tokens=out.prompt_tokens, completion_tokens=out.completion_tokens,
                 total_tokens=out.prompt_tokens + out.completion_tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=out.cached_tokens))


def _raise_if_failed(out) -> None:
    if out.finish_reason == "error":
        raise APIError(500, f"generation failed: {out.error}", code="generation_failed")
