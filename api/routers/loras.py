"""/v1/loras: the LoRA adapters requests may name, with what they fit and whether one is loaded."""

import sys

from fastapi import APIRouter, Depends

from ..auth import authenticate
from ..services import Services, services

router = APIRouter(prefix="/v1/loras", tags=["loras"], dependencies=[Depends(authenticate)])


def _loaded_here(svc: Services) -> set[str] | None:
    """Adapters loaded in this process, where its embedded queue runs the jobs; None where the
    workers are other processes (not known here)."""
    if svc.settings.queue != "embedded":
        return None
    module = sys.modules.get("vidserve.pipelines.loras")  # not imported: no job has run, nothing is loaded
    return module.loaded_names() if module is not None else set()


@router.get("")
async def list_loras(svc: Services = Depends(services)):
    loaded = _loaded_here(svc)
    data = [{**adapter.to_dict(), "loaded": None if loaded is None else adapter.name in loaded}
            for adapter in svc.adapters.adapters.values()]
    return {"object": "list", "data": data}
