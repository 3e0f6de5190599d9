"""`WS /v1/realtime/video`: the socket's caller, then its session (`api/realtime_session.py`;
the messages are `api/protocol/realtime.py`)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from vidserve.keys import Caller

from ..auth import identify
from ..protocol.realtime import KEY_SUBPROTOCOL_PREFIX, PATH, SUBPROTOCOL, CloseCode
from ..realtime_session import Session
from ..services import Services

router = APIRouter(tags=["realtime"])


@router.websocket(PATH)
async def realtime_video(ws: WebSocket) -> None:
    svc: Services = ws.app.state.services
    caller = _caller(svc, ws)
    if caller is None:
        await ws.close(CloseCode.policy_violation, "missing or invalid API key; send 'Authorization: Bearer YOUR_KEY' "
                                                   f"or the subprotocol {KEY_SUBPROTOCOL_PREFIX}YOUR_KEY")
        return
    await ws.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in ws.scope.get("subprotocols", []) else None)
    await Session(ws, svc, caller).run()


def _caller(svc: Services, ws: WebSocket) -> Caller | None:
    """The key's caller, from the Authorization header or, from a browser, a subprotocol."""
    caller = identify(svc, ws.headers)
    if caller is None:
        keys = [p[len(KEY_SUBPROTOCOL_PREFIX):] for p in ws.scope.get("subprotocols", [])
                if p.startswith(KEY_SUBPROTOCOL_PREFIX)]
        caller = svc.keyring.caller(keys[0].encode()) if keys else None
    return caller
