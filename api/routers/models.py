"""/v1/models: what this server can run, OpenAI-shaped, with the serving facts beside."""

from fastapi import APIRouter, Depends

from vidserve.errors import echo
from vidserve.registry import MODELS

from ..auth import authenticate
from ..errors import APIError
from ..protocol.errors import errors
from ..protocol.models import ChatModel, ModelList, VideoModel
from ..services import Services, services

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[Depends(authenticate)])


def _models(svc: Services) -> list[VideoModel | ChatModel]:
    """Video models this server can run, then the chat model it runs (if any)."""
    data: list[VideoModel | ChatModel] = [VideoModel.of(spec, svc.settings.max_side) for spec in MODELS.values()]
    if svc.chat is not None:
        data.append(ChatModel.of(svc.chat.engine.model.spec))
    return data


@router.get("", response_model=ModelList)
async def list_models(svc: Services = Depends(services)) -> ModelList:
    """Video models this server can run, then the chat model it runs (if any)."""
    return ModelList(data=_models(svc))


# `:path`: a chat model's id may be a Hugging Face Hub id, owner/name.
@router.get("/{model:path}", response_model=VideoModel | ChatModel, responses=errors(404))
async def retrieve_model(model: str, svc: Services = Depends(services)) -> VideoModel | ChatModel:
    """One model of the list, as OpenAI's `models.retrieve` asks for it."""
    found = next((card for card in _models(svc) if card.id == model), None)
    if found is None:
        raise APIError(404, f"no model {echo(model)} on this server; GET /v1/models lists them", param="model",
                       code="model_not_found")
    return found
