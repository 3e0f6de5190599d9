"""/v1/loras: the LoRA adapters requests may name, with what they fit and whether one is loaded."""

from fastapi import APIRouter, Depends

from vidserve.loras import LOADED_ADAPTERS

from ..auth import authenticate
from ..protocol.models import LoraAdapter, LoraList
from ..services import Services, services

router = APIRouter(prefix="/v1/loras", tags=["loras"], dependencies=[Depends(authenticate)])


def _loaded_here(svc: Services) -> frozenset[str] | None:
    """Adapters loaded in this process, where its embedded queue runs the jobs (as its pipelines
    publish them: none before the first job); None where the workers are other processes (not
    known here)."""
    return LOADED_ADAPTERS.names() if svc.settings.queue == "embedded" else None


@router.get("", response_model=LoraList)
async def list_loras(svc: Services = Depends(services)) -> LoraList:
    loaded = _loaded_here(svc)
    return LoraList(data=[LoraAdapter.of(adapter, None if loaded is None else adapter.name in loaded)
                          for adapter in svc.adapters.adapters.values()])
