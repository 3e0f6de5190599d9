"""/v1/models: what this server can run, OpenAI-shaped, with the serving facts beside."""

from pathlib import Path

from fastapi import APIRouter, Depends, Request

from vidserve.config import Settings
from vidserve.registry import MODELS

from ..auth import authenticate

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[Depends(authenticate)])


def _source(source: str) -> str:
    """Where a model's weights come from, naming no folder on this server: a hub id, "builtin",
    or "local" (the bundled models, folders on disk)."""
    return "local" if Path(source).is_absolute() else source


def _model(spec, settings: Settings) -> dict:
    return {"id": spec.name, "object": "model", "created": 0, "owned_by": "vidserve", "kind": spec.kind,
            "size": f"{spec.width}x{spec.height}", "sizes": _sizes(spec, settings), "fps": spec.fps,
            "frames_per_chunk": spec.frames_per_chunk,
            "source": _source(spec.source), "description": spec.description,
            "presets": [preset.to_dict(name) for name, preset in spec.presets], "understands": _understands(spec)}


def _sizes(spec, settings: Settings) -> dict:
    """The sizes a request may ask of it here: each side a multiple of `multiple`, from `multiple` to
    `max_side` (what its position table covers, or this server's limit if lower); and those it was
    trained at (none: random weights), far from which it warns."""
    return {"multiple": spec.size_multiple, "max_side": min(spec.max_side, settings.max_side),
            "trained": [f"{width}x{height}" for width, height in spec.trained_sizes]}


def _chat_model(spec) -> dict:
    return {"id": spec.name, "object": "model", "created": 0, "owned_by": "vidserve", "kind": "chat",
            "vision": spec.vision, "source": _source(spec.source), "description": spec.description,
            "understands": _understands(spec)}


def _understands(spec) -> dict | None:
    """The prompts a model trained on one caption pattern reads (null: any text, or nothing in particular)."""
    return spec.understands.to_dict() if spec.understands is not None else None


@router.get("")
async def list_models(request: Request):
    """Video models this server can run, then the chat model it runs (if any)."""
    data = [_model(spec, request.app.state.services.settings) for spec in MODELS.values()]
    chat = request.app.state.services.chat
    if chat is not None:
        data.append(_chat_model(chat.engine.model.spec))
    return {"object": "list", "data": data}
