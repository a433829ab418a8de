"""`GET /v1/model`: what the service runs."""
from __future__ import annotations

from fastapi import APIRouter, Depends

import stylevar

from serve.http.errors import ERROR_RESPONSES
from serve.http.schemas import ModelInfo
from serve.http.state import ServiceState, get_state, require_key, require_loaded

router = APIRouter(dependencies=[Depends(require_key)])


@router.get("/v1/model", response_model=ModelInfo, responses={s: ERROR_RESPONSES[s] for s in (401, 429, 503)})
async def model_info(state: ServiceState = Depends(get_state)) -> ModelInfo:  # noqa: B008
    """The loaded model: configuration, demo flag, devices, dtype, precision (and why) and library version."""
    runner = require_loaded(state).runner
    cfg, precision = runner.pipe.config, runner.precision
    return ModelInfo(name=cfg.name, demo=cfg.demo, version=stylevar.__version__,
                     devices=[str(r.device) for r in state.runners], dtype=runner.dtype_name,
                     precision=precision.precision, precision_reason=precision.reason,
                     image_size=runner.pipe.image_size, patch_nums=list(cfg.transformer.patch_nums),
                     default_alphas=list(cfg.transformer.alpha_nums), vocab_size=cfg.transformer.vocab_size,
                     config=cfg.to_dict())
