"""/v1/models: what this server can run, OpenAI-shaped, with the serving facts beside."""

from pathlib import Path

from fastapi import APIRouter, Depends, Request

from vidserve.registry import MODELS

from ..auth import authenticate

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[Depends(authenticate)])


def _source(source: str) -> str:
    """Where a model's weights come from, naming no folder on this server: a hub id, "builtin",
    or "local" (the bundled models, folders on disk)."""
    return "local" if Path(source).is_absolute() else source


def _model(spec) -> dict:
    return {"id": spec.name, "object": "model", "created": 0, "owned_by": "vidserve", "kind": spec.kind,
            "size": f"{spec.width}x{spec.height}", "fps": spec.fps, "frames_per_chunk": spec.frames_per_chunk,
            "source": _source(spec.source), "description": spec.description,
            "presets": [preset.to_dict(name) for name, preset in spec.presets]}


def _chat_model(spec) -> dict:
    return {"id": spec.name, "object": "model", "created": 0, "owned_by": "vidserve", "kind": "chat",
            "vision": spec.vision, "source": _source(spec.source), "description": spec.description}


@router.get("")
async def list_models(request: Request):
    """Video models this server can run, then the chat model it runs (if any)."""
    data = [_model(spec) for spec in MODELS.values()]
    chat = request.app.state.services.chat
    if chat is not None:
        data.append(_chat_model(chat.engine.model.spec))
    return {"object": "list", "data": data}
