"""Realtime sessions: `WS /v1/realtime/video`, a video job made while the client watches and
steers it.

The client sends JSON text messages: `session.create` (any field `POST /v1/videos` takes;
without `seconds` the session runs to `VIDSERVE_REALTIME_MAX_SECONDS`), `prompt.update`
(the prompt of every chunk not yet begun; acknowledged with `prompt.updated` and the chunk it
applies from) and `session.stop` (the video ends after the chunk under way and completes).
The server sends `video.created`, `video.queued` (while it waits, each time its place in line
changes: `position` and `estimated_start_at`),
`video.progress`, then its stream as binary fMP4: the init segment once, and for each chunk a
`chunk.done` text message followed by the chunk's fragment; last `video.completed`,
`video.failed` or `video.cancelled` with the video, and it closes. Whatever ends the socket
before the video ends (the client closing it, a message over the size limit, a failure in the
server) cancels the video. A bad message (not JSON, JSON no reader could take, text that is not
valid Unicode, a value `POST /v1/videos` would refuse, a prompt update past the cap) gets an
`error` message and the session goes on.

The session is an ordinary job throughout: retrievable, downloadable and streamable over HLS
like any other, each chunk's prompt in `chunks[i].prompt`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnected

from vidserve import jobs
from vidserve.errors import InvalidRequest, VidserveError
from vidserve.jobs import InvalidTransition, Job, JobNotFound, JobStatus, PromptUpdatesUsedUp
from vidserve.jobs.outages import STORE_UNAVAILABLE
from vidserve.keys import Caller

from ..auth import identify, rate_refusal, spend
from ..forms import reference_bytes, require_unicode, validate
from ..errors import APIError
from ..schemas import VideoCreate
from ..services import Services
from ..submission import submit_video

router = APIRouter(tags=["realtime"])
log = logging.getLogger("vidserve.api")

POLL_SECONDS = 0.2
# Browsers cannot set an Authorization header on a WebSocket: they may send the key as a
# subprotocol, `vidserve.key.KEY`, beside `vidserve`. A browser that offers subprotocols closes a
# socket whose server names none back; the server answers `vidserve`, never echoing the key.
KEY_PROTOCOL = "vidserve.key."
PROTOCOL = "vidserve"
MESSAGE_TOO_BIG = 1009
POLICY_VIOLATION = 1008
INTERNAL_ERROR = 1011


@router.websocket("/v1/realtime/video")
async def realtime_video(ws: WebSocket) -> None:
    svc: Services = ws.app.state.services
    caller = _caller(svc, ws)
    if caller is None:
        await ws.close(POLICY_VIOLATION, "missing or invalid API key; send 'Authorization: Bearer YOUR_KEY' or the "
                                         f"subprotocol {KEY_PROTOCOL}YOUR_KEY")
        return
    await ws.accept(subprotocol=PROTOCOL if PROTOCOL in ws.scope.get("subprotocols", []) else None)
    await Session(ws, svc, caller).run()


def _caller(svc: Services, ws: WebSocket) -> Caller | None:
    caller = identify(svc, ws.headers)
    if caller is None:
        keys = [p[len(KEY_PROTOCOL):] for p in ws.scope.get("subprotocols", []) if p.startswith(KEY_PROTOCOL)]
        caller = svc.keyring.caller(keys[0].encode()) if keys else None
    return caller


class SessionClosed(Exception):
    """The client went away, or sent what closes the session."""


# What sending on a socket the client has left raises: starlette's WebSocketDisconnect (the
# server's send failed) or WebSocketDisconnected (a RuntimeError: the socket is already closed).
GONE = (WebSocketDisconnect, WebSocketDisconnected)


class Session:
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
                message = receive.result()
                if message is not None:
                    await self._handle(message)
                if pusher is None and self.video_id is not None:
                    pusher = asyncio.ensure_future(self._push(self.video_id))
        except (SessionClosed, *GONE):
            pass
        except Exception:  # a bug: logged with its traceback, and the socket closed properly
            log.exception("realtime session %s failed", self.video_id)
            await self._close(INTERNAL_ERROR, "internal server error")
        finally:
            if pusher is not None:
                pusher.cancel()
            if self.video_id is not None and not video_ended:  # whatever ended the socket, the video ends too
                await run_in_threadpool(self._cancel)

    async def _receive(self) -> dict[str, Any] | None:
        """The next JSON message (None after answering a bad one with an error)."""
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
            await self._close(MESSAGE_TOO_BIG, f"a message may hold at most {self.limit} bytes")
            raise SessionClosed()
        try:
            message = json.loads(text)
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
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            await self._error("invalid_message", 'a message is a JSON object with a "type"')
            return None
        try:
            require_unicode(message, "the message")
        except APIError as exc:
            await self._error(exc.code, exc.message, exc.param)
            return None
        return message

    async def _handle(self, message: dict[str, Any]) -> None:
        kind = message.pop("type")
        try:
            if kind == "session.create":
                await self._create(message)
            elif kind in ("prompt.update", "session.stop") and self.video_id is None:
                raise InvalidRequest(f"{kind} needs a session: send session.create first", code="no_session")
            elif kind == "prompt.update":
                await self._update_prompt(message)
            elif kind == "session.stop":
                job = await run_in_threadpool(self.svc.store.update, self.video_id, jobs.request_stop)
                await self._send({"type": "session.stopping", "after_chunks": job.stop_after_chunks})
            else:
                raise InvalidRequest(f"unknown message type {kind[:64]!r}; send session.create, prompt.update or "
                                     "session.stop", param="type", code="unknown_type")
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

    async def _create(self, fields: dict[str, Any]) -> None:
        if self.video_id is not None:
            raise InvalidRequest(f"this socket's session is video {self.video_id}; open another socket for another "
                                 "session", code="session_exists")
        wait = spend(self.svc, self.caller)
        if wait > 0:
            raise rate_refusal(self.svc, self.caller, wait)
        image = fields.pop("image", None)  # a data URL, as the realtime spelling of input_reference
        if image is not None:
            fields.setdefault("input_reference", {"image_url": image})
        reference = fields.pop("input_reference", None)
        image_bytes = reference_bytes(reference, self.svc.settings.max_upload_bytes) if reference else None
        body = validate(VideoCreate, fields)
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
        await self._send({"type": "video.created", "video": await self._video(job)})

    async def _update_prompt(self, message: dict[str, Any]) -> None:
        prompt = message.get("prompt")
        limit = self.svc.settings.max_prompt_chars
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > limit:
            raise InvalidRequest(f"prompt must be a non-empty string of at most {limit} characters", param="prompt")
        update = jobs.update_prompt(prompt, self.svc.settings.realtime_max_prompt_updates)
        try:
            job = await run_in_threadpool(self.svc.store.update, self.video_id, update)
        except PromptUpdatesUsedUp as exc:
            raise InvalidRequest(str(exc), param="prompt", code="too_many_prompt_updates") from None
        except InvalidTransition as exc:
            raise InvalidRequest(str(exc), param="prompt", code="session_stopped") from None
        await self._send({"type": "prompt.updated", "from_chunk": job.prompt_updates[-1]["from_chunk"]})

    async def _push(self, video_id: str) -> None:
        """The video as it is made: its place in the queue, progress, segments, then its end."""
        sent: set[str] = set()
        position = progress = None
        while True:
            job = await run_in_threadpool(self.svc.store.get, video_id)
            if job is None:
                await self._send({"type": "video.deleted", "video_id": video_id})
                return
            if job.status is JobStatus.queued:
                video = await self._video(job)
                if video["queue_position"] != position:
                    position = video["queue_position"]
                    await self._send({"type": "video.queued", "position": position,
                                      "estimated_start_at": video["estimated_start_at"]})
            elif job.progress != progress:
                progress = job.progress
                await self._send({"type": "video.progress", "progress": progress, "stage": job.stage})
            await self._send_segments(job, sent)
            if job.status.terminal:
                await self._send({"type": f"video.{job.status.value}", "video": await self._video(job)})
                return
            await asyncio.sleep(POLL_SECONDS)

    async def _send_segments(self, job: Job, sent: set[str]) -> None:
        frames = {f"{c['index']}.m4s": c["frames"] for c in job.chunks}
        for segment in job.segments:
            if segment["name"] in sent or segment["name"] not in frames:
                continue
            if not sent:
                await self._send_bytes(await run_in_threadpool(self.svc.storage.read_bytes, job.stream_init_key))
            sent.add(segment["name"])
            await self._send({"type": "chunk.done", "index": int(segment["name"].removesuffix(".m4s")),
                              "frames": frames[segment["name"]]})
            await self._send_bytes(await run_in_threadpool(self.svc.storage.read_bytes, segment["key"]))

    def _cancel(self) -> None:
        try:
            self.svc.store.update(self.video_id, jobs.request_cancel)
        except JobNotFound:
            pass
        except STORE_UNAVAILABLE as exc:  # the socket is gone either way; the video runs to its end
            log.warning("realtime session %s ended, but its video could not be cancelled: %s", self.video_id, exc)

    async def _video(self, job: Job) -> dict[str, Any]:
        return (await run_in_threadpool(self.svc.video, job)).model_dump(mode="json")

    async def _send(self, message: dict[str, Any]) -> None:
        await _unless_gone(self.ws.send_text(json.dumps(message)))

    async def _send_bytes(self, data: bytes) -> None:
        await _unless_gone(self.ws.send_bytes(data))

    async def _close(self, code: int = 1000, reason: str | None = None) -> None:
        try:
            await self.ws.close(code, reason)
        except GONE:
            pass  # the client left first

    async def _error(self, code: str, message: str, param: str | None = None) -> None:
        await self._send({"type": "error", "code": code, "message": message, "param": param})


async def _unless_gone(sending: Awaitable[None]) -> None:
    """Send, or end the session quietly when the client has left: that is no error."""
    try:
        await sending
    except GONE:
        raise SessionClosed() from None
