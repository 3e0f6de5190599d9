"""A realtime session: one socket's video, made while its client watches and steers it
(`WS /v1/realtime/video`; the messages are `api/protocol/realtime.py`).

`session.create` submits the same job `POST /v1/videos` does (`submit_video`); the session then
follows the job's events (`JobEvents.follow`, woken by the store: no poll) and pushes it down the
socket as it is made (its place in line, progress, each recorded segment, its end), and writes the client's prompt updates and stop into the job, where the runner reads
them. Every message is handled here: a bad one gets an `error` message and the session goes on.
Whatever ends the socket before the video ends (the client closing it, a message over the size
limit, a failure in the server) cancels the video, in a `finally`. The session is an ordinary job
throughout: retrievable, downloadable and streamable over HLS like any other.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable

from fastapi import WebSocket, WebSocketDisconnect
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnected

from vidserve import jobs
from vidserve.errors import InvalidRequest, VidserveError, from_validation_error
from vidserve.jobs import InvalidTransition, Job, JobNotFound, JobStatus, PromptUpdatesUsedUp
from vidserve.jobs.events import ChunkFinished, Deleted, Progressed, StatusChanged
from vidserve.jobs.outages import STORE_UNAVAILABLE
from vidserve.jobs.place_in_line import PlaceInLine
from vidserve.jobs.video_object import VideoObject
from vidserve.keys import Caller
from vidserve.media.images import decode_data_url

from .auth import rate_refusal, spend
from .errors import APIError
from .forms import require_unicode
from .protocol.realtime import (CLIENT_MESSAGES, CLIENT_TYPES, ChunkDoneMessage, ClientMessage, CloseCode,
                                ErrorMessage, PromptUpdatedMessage, PromptUpdateMessage, ServerMessage,
                                SessionCreateMessage, SessionStoppingMessage, VideoCreatedMessage,
                                VideoDeletedMessage, VideoEndedMessage, VideoProgressMessage, VideoQueuedMessage)
from .services import Services
from .submission import submit_video

log = logging.getLogger("vidserve.api")


class SessionClosed(Exception):
    """The client went away, or sent what closes the session."""


# What sending on a socket the client has left raises: starlette's WebSocketDisconnect (the
# server's send failed) or WebSocketDisconnected (a RuntimeError: the socket is already closed).
GONE = (WebSocketDisconnect, WebSocketDisconnected)


class Session:
    """One accepted socket's session, given what it works with: the services, the caller, the socket."""

    def __init__(self, ws: WebSocket, svc: Services, caller: Caller):
        self.ws, self.svc, self.caller = ws, svc, caller
        self.limit = svc.settings.max_body_bytes  # a session.create may carry an image
        self.video_id: str | None = None

    async def run(self) -> None:
        pusher: asyncio.Task | None = None
        video_ended = False
        try:
            while True:
                receive = asyncio.ensure_future(self._receive())
                waiting = {receive} | ({pusher} if pusher is not None else set())
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if pusher is not None and pusher in done:
                    receive.cancel()
                    pusher.result()  # the video ended and was announced (or the push failed: raise)
                    video_ended = True
                    await self._close()
                    return
                fields = receive.result()
                if fields is not None:
                    await self._handle(fields)
                if pusher is None and self.video_id is not None:
                    pusher = asyncio.ensure_future(self._push(self.video_id))
        except (SessionClosed, *GONE):
            pass
        except Exception:  # a bug: logged with its traceback, and the socket closed properly
            log.exception("realtime session %s failed", self.video_id)
            await self._close(CloseCode.internal_error, "internal server error")
        finally:
            if pusher is not None:
                pusher.cancel()
            if self.video_id is not None and not video_ended:  # whatever ended the socket, the video ends too
                await run_in_threadpool(self._cancel)

    async def _receive(self) -> dict[str, Any] | None:
        """The next message as decoded JSON, an object with a string `type` (None after answering
        a bad one with an error)."""
        try:
            event = await self.ws.receive()
        except WebSocketDisconnected:
            raise SessionClosed() from None
        if event["type"] == "websocket.disconnect":
            raise SessionClosed()
        if event.get("text") is None:
            await self._error("binary_not_accepted", "send JSON text messages; only the server sends binary ones")
            return None
        text = event["text"]
        if len(text.encode()) > self.limit:
            await self._close(CloseCode.message_too_big, f"a message may hold at most {self.limit} bytes")
            raise SessionClosed()
        try:
            fields = json.loads(text)
        except RecursionError:
            await self._error("json_too_deep", "the message nests lists and objects too deep to read")
            return None
        except json.JSONDecodeError as exc:
            await self._error("invalid_json", f"the message is not JSON: {exc}")
            return None
        except ValueError:  # json reads integers of at most 4300 digits (sys.get_int_max_str_digits)
            await self._error("invalid_json", "the message holds a number too long to read; send numbers of at "
                                              "most 4300 digits")
            return None
        if not isinstance(fields, dict) or not isinstance(fields.get("type"), str):
            await self._error("invalid_message", 'a message is a JSON object with a "type"')
            return None
        try:
            require_unicode(fields, "the message")
        except APIError as exc:
            await self._error(exc.code, exc.message, exc.param)
            return None
        return fields

    async def _handle(self, fields: dict[str, Any]) -> None:
        kind = fields["type"]
        try:
            message = _client_message(fields)
            if isinstance(message, SessionCreateMessage):
                await self._create(message)
            elif self.video_id is None:
                raise InvalidRequest(f"{kind} needs a session: send session.create first", code="no_session")
            elif isinstance(message, PromptUpdateMessage):
                await self._update_prompt(message.prompt)
            else:
                job = await run_in_threadpool(self.svc.store.update, self.video_id, jobs.request_stop)
                await self._send(SessionStoppingMessage(after_chunks=job.stop_after_chunks))
        except (SessionClosed, *GONE):
            raise
        except APIError as exc:
            await self._error(exc.code or "invalid_request", exc.message, exc.param)
        except VidserveError as exc:  # a bad value, or the storage out of reach
            await self._error(exc.code, exc.message, getattr(exc, "param", None))
        except STORE_UNAVAILABLE:
            await self._error("store_unavailable", "the job store is unavailable; retry shortly")
        except JobNotFound:
            await self._error("not_found", f"video {self.video_id} was deleted", "video_id")
        except Exception:  # a bug, answered as HTTP answers one (a 500), and the session goes on
            log.exception("realtime session %s: %s message failed", self.video_id, kind[:64])
            await self._error("internal_error", "internal server error")

    async def _create(self, body: SessionCreateMessage) -> None:
        if self.video_id is not None:
            raise InvalidRequest(f"this socket's session is video {self.video_id}; open another socket for another "
                                 "session", code="session_exists")
        wait = spend(self.svc, self.caller)
        if wait > 0:
            raise rate_refusal(self.svc, self.caller, wait)
        image_bytes = self._first_frame(body)
        settings = self.svc.settings
        if body.seconds is None and body.num_frames is None:  # open-ended: as long as anything allows
            cap = min(settings.realtime_max_seconds, self.caller.limit("max_seconds", settings.max_seconds))
            body = body.model_copy(update={"seconds": cap})
        elif body.seconds is not None and body.seconds > settings.realtime_max_seconds:
            raise InvalidRequest(f"seconds is {body.seconds:g}; a realtime session lasts at most "
                                 f"{settings.realtime_max_seconds:g} s (VIDSERVE_REALTIME_MAX_SECONDS)",
                                 param="seconds")
        job = await run_in_threadpool(submit_video, self.svc, self.caller, body, image_bytes)
        self.video_id = job.id
        await self._send(VideoCreatedMessage(video=await self._video(job)))

    def _first_frame(self, body: SessionCreateMessage) -> bytes | None:
        """The first frame's bytes, from `input_reference` (as a JSON body of POST /v1/videos has it) or `image`."""
        limit = self.svc.settings.max_upload_bytes
        if body.input_reference is not None:
            return decode_data_url(body.input_reference.image_url, "input_reference", limit)
        return decode_data_url(body.image, "image", limit) if body.image is not None else None

    async def _update_prompt(self, prompt: str) -> None:
        limit = self.svc.settings.max_prompt_chars
        if not prompt.strip() or len(prompt) > limit:
            raise InvalidRequest(f"prompt must be a non-empty string of at most {limit} characters", param="prompt")
        update = jobs.update_prompt(prompt, self.svc.settings.realtime_max_prompt_updates)
        try:
            job = await run_in_threadpool(self.svc.store.update, self.video_id, update)
        except PromptUpdatesUsedUp as exc:
            raise InvalidRequest(str(exc), param="prompt", code="too_many_prompt_updates") from None
        except InvalidTransition as exc:
            raise InvalidRequest(str(exc), param="prompt", code="session_stopped") from None
        await self._send(PromptUpdatedMessage(from_chunk=job.prompt_updates[-1].from_chunk))

    async def _push(self, video_id: str) -> None:
        """The video as it is made (`JobEvents.follow`): its place in line, progress, each chunk's
        segment, then its end."""
        position = progress = None
        init_sent = False
        async for event in self.svc.events.follow(video_id):
            match event:
                case StatusChanged(job=job, place=place) if job.status is JobStatus.queued:
                    video = await self._video(job, {job.id: place} if place else {})
                    if video.queue_position != position:
                        position = video.queue_position
                        await self._send(VideoQueuedMessage(position=position,
                                                            estimated_start_at=video.estimated_start_at))
                case StatusChanged(job=job) | Progressed(job=job):
                    if job.progress != progress:
                        progress = job.progress
                        await self._send(VideoProgressMessage(progress=progress, stage=job.stage))
                    if job.status.terminal:
                        await self._send(VideoEndedMessage.of(await self._video(job)))
                        return
                case ChunkFinished(job=job, chunk=chunk, segment=segment) if segment is not None:
                    if not init_sent:
                        await self._send_bytes(await run_in_threadpool(self.svc.storage.read_bytes,
                                                                       job.stream_init_key))
                        init_sent = True
                    await self._send(ChunkDoneMessage(index=chunk.index, frames=chunk.frames))
                    await self._send_bytes(await run_in_threadpool(self.svc.storage.read_bytes, segment.key))
                case Deleted():
                    await self._send(VideoDeletedMessage(video_id=video_id))
                    return
                case _:  # Quiet, or a segment no chunk made (an extension's source): nothing a session tells
                    pass

    def _cancel(self) -> None:
        try:
            self.svc.store.update(self.video_id, jobs.request_cancel)
        except JobNotFound:
            pass
        except STORE_UNAVAILABLE as exc:  # the socket is gone either way; the video runs to its end
            log.warning("realtime session %s ended, but its video could not be cancelled: %s", self.video_id, exc)

    async def _video(self, job: Job, places_in_line: dict[str, PlaceInLine] | None = None) -> VideoObject:
        return await run_in_threadpool(self.svc.video, job, places_in_line)

    async def _send(self, message: ServerMessage) -> None:
        await _unless_gone(self.ws.send_text(message.model_dump_json()))

    async def _send_bytes(self, data: bytes) -> None:
        await _unless_gone(self.ws.send_bytes(data))

    async def _close(self, code: CloseCode = CloseCode.normal, reason: str | None = None) -> None:
        try:
            await self.ws.close(code, reason)
        except GONE:
            pass  # the client left first

    async def _error(self, code: str, message: str, param: str | None = None) -> None:
        await self._send(ErrorMessage(code=code, message=message, param=param))


def _client_message(fields: dict[str, Any]) -> ClientMessage:
    """The message as its model; what no model takes is an InvalidRequest naming the field at fault."""
    try:
        return CLIENT_MESSAGES.validate_python(fields)
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "union_tag_invalid":
            raise InvalidRequest(f"unknown message type {fields['type'][:64]!r}; send "
                                 f"{', '.join(CLIENT_TYPES[:-1])} or {CLIENT_TYPES[-1]}", param="type",
                                 code="unknown_type") from None
        # Every error's location starts with the message's type (the union's tag); the field's path follows.
        raise from_validation_error(exc, skip=(fields["type"],)) from None


async def _unless_gone(sending: Awaitable[None]) -> None:
    """Send, or end the session quietly when the client has left: that is no error."""
    try:
        await sending
    except GONE:
        raise SessionClosed() from None
