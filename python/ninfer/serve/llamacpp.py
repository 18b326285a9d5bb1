"""llama.cpp's router-mode management surface (what llama-ui calls) and llama-swap's operations routes.

    POST /models/load {model}      -> {success: true} at once; /models/sse reports the load
    POST /models/unload {model}    -> {success: true}; the model unloads once its in-flight requests finish (a
                                      loading one: its load is cancelled); 409 when it is neither
    GET  /models/sse               -> `model_status` events on every load / swap / unload (with the load's progress),
                                      keepalives every `sse_ping_interval` s of the router config (default 5)
    GET  /props[?model=&autoload=] -> what llama-ui reads (role, default_generation_settings, total_slots, ...)
    GET  /slots[?model=]           -> one object per configured lane of the model
    GET  /running, GET /unload     -> llama-swap

`model_rows` gives the `/v1/models` rows with their router `status` and `architecture.input_modalities`
(ninfer.serve.misc serves them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from litestar import Response, get, post
from litestar.params import FromQuery, JSONBody

from ninfer import __version__ as NINFER_VERSION
from ninfer.engine import DEFAULT_SAMPLER_ORDER
from ninfer.frontend.sampling_defaults import recommended_sampling
from ninfer.serve.errors import Conflict
from ninfer.serve.gate import EXEMPT, RouterDependency
from ninfer.serve.generation import DRY_SEQUENCE_BREAKERS, UNTIL_CONTEXT_END
from ninfer.serve.router import (
    FAILED,
    LOADED,
    LOADING,
    ModelEntry,
    ModelNotFoundError,
    ModelRouter,
    StatusEvent,
)
from ninfer.serve.sse import EVENT_STREAM, sse_frame, sse_response
from ninfer.serve.state import ServedModel

# The load stages llama-ui knows are text_model, spec_model (a draft model) and mmproj_model (a vision projector);
# the config refuses the spec and vision options until they exist, so every model here loads one stage.
LOAD_STAGES = ["text_model"]
# llama-swap's process states for our statuses
SWAP_STATES = {LOADED: "ready", LOADING: "starting", FAILED: "stopped"}


class ModelRequest(msgspec.Struct, kw_only=True):
    model: str
    extra_args: list[str] | None = None


def _status(entry: ModelEntry) -> dict[str, Any]:
    # A load that waits for another model's requests is reported as loading (at 0%), so llama-ui shows its spinner
    # rather than "unloaded"; the message says what it waits for.
    status: dict[str, Any] = {"value": LOADING if entry.waiting else entry.status, "args": []}
    if entry.failure is not None:
        status["failed"] = True
        status["message"] = entry.failure
    if entry.waiting:
        status["message"] = entry.waiting
    return status


def model_rows(router: ModelRouter, loaded_row: Callable[[ServedModel], dict[str, Any]]) -> list[dict[str, Any]]:
    """One `/v1/models` row per configured model: the loaded one's full row (`loaded_row`), the others from their
    config; each with llama.cpp's router fields."""
    rows = []
    for entry in router.entries:
        spec = entry.spec
        row = loaded_row(entry.served) if entry.served is not None else {
            "id": spec.name, "object": "model", "created": int(router.started), "owned_by": "ninfer",
            "meta": {"n_ctx": spec.options.max_context, "kv_dtype": spec.options.kv_dtype,
                     "max_concurrency": spec.options.max_concurrency}}
        # llama.cpp's router field for every model, loaded or not: llama-ui lets a chat attach images only to a
        # model whose input modalities have them.
        inputs = ["text", "image", "video"] if spec.options.vision else ["text"]
        row.update(status=_status(entry), in_cache=spec.path.is_file(), path=str(spec.path),
                   aliases=list(spec.aliases), tags=[], description=spec.description,
                   architecture={"input_modalities": inputs})
        rows.append(row)
    return rows


# -- load / unload / status feed -----------------------------------------------------------------------------------


@post("/models/load", status_code=200, opt=EXEMPT, raises=[ModelNotFoundError], summary="Start loading a model (returns at once)")
async def load_model(data: JSONBody[ModelRequest], router: RouterDependency) -> dict[str, Any]:
    router.request_load(data.model)
    return {"success": True}


@post("/models/unload", status_code=200, opt=EXEMPT, raises=[ModelNotFoundError, Conflict],
      summary="Unload a model once its requests finish, or cancel its load")
async def unload_model(data: JSONBody[ModelRequest], router: RouterDependency) -> dict[str, Any]:
    entry = router.lookup(data.model)
    if not router.request_unload(entry.name):
        raise Conflict(detail=f"model {entry.name!r} is neither loaded nor loading ({entry.status})")
    return {"success": True}


def status_event_json(event: StatusEvent) -> dict[str, Any]:
    """llama.cpp's envelope: {model, event, data: {status, progress, exit_code}}, plus `message` for a failure or a
    wait (llama-ui shows a loading model's `message` in place of its percent: waiting-message.patch)."""
    progress = {"stages": LOAD_STAGES, "current": "text_model", "value": event.progress}
    data: dict[str, Any] = {"status": LOADING if event.waiting else event.status, "progress": progress,
                            "exit_code": 1 if event.status == FAILED and not event.waiting else 0}
    if event.failure is not None:
        data["message"] = event.failure
    if event.waiting:
        data["message"] = event.waiting
    return {"model": event.model, "event": "model_status", "data": data, "time": event.at}


async def _status_frames(router: ModelRouter) -> AsyncIterator[bytes]:
    queue = router.subscribe()
    try:
        # First the current state of every model, so a new reader starts from the truth; then each change.
        for entry in router.entries:
            snapshot = StatusEvent(entry.name, entry.status, entry.failure, time.time(), entry.progress,
                                   entry.waiting)
            yield sse_frame(status_event_json(snapshot), event="model_status")
        while True:
            event = await queue.get()
            if event is None:
                return
            yield sse_frame(status_event_json(event), event="model_status")
    finally:
        router.unsubscribe(queue)


@get("/models/sse", summary="Live model status events (llama.cpp router mode)", media_type=EVENT_STREAM)
async def models_sse(router: RouterDependency) -> Any:
    return sse_response(_status_frames(router), ping_interval_s=router.config.sse_ping_interval_s)


# -- props and slots -----------------------------------------------------------------------------------------------


def generation_settings(entry: ModelEntry) -> dict[str, Any]:
    """llama.cpp's `default_generation_settings.params`: what a request that sets nothing gets (the settings dialog
    shows these). The thinking-mode values: the Qwen3.5 templates think unless told not to. Before the model is
    loaded its architecture is unknown: llama.cpp's defaults under the config's `sampling`."""
    served = entry.served
    s = (served.sampling_defaults(thinking=True) if served is not None
         else recommended_sampling("", {}, entry.spec.sampling, thinking=True))
    max_tokens = entry.spec.max_tokens if served is None else served.default_max_tokens
    limit = UNTIL_CONTEXT_END if max_tokens is None else max_tokens
    return {
        "n_predict": limit, "max_tokens": limit, "seed": -1, "temperature": s.temperature,
        "dynatemp_range": s.dynatemp_range, "dynatemp_exponent": s.dynatemp_exponent, "top_k": s.top_k,
        "top_p": s.top_p, "min_p": s.min_p, "top_n_sigma": s.top_n_sigma, "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold, "typical_p": s.typical_p, "typ_p": s.typical_p,
        "repeat_last_n": s.penalty_last_n, "repeat_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": s.dry_multiplier, "dry_base": s.dry_base, "dry_allowed_length": s.dry_allowed_length,
        "dry_penalty_last_n": s.dry_penalty_last_n, "dry_sequence_breakers": list(DRY_SEQUENCE_BREAKERS),
        "samplers": list(s.order or DEFAULT_SAMPLER_ORDER), "stop": [], "n_probs": 0, "stream": True,
        "timings_per_token": False,
    }


def _model_props(router: ModelRouter, entry: ModelEntry) -> dict[str, Any]:
    spec, served = entry.spec, entry.served
    frontend = served.engine.frontend if served is not None else None
    template = frontend.chat_template if frontend is not None else None
    return {
        "role": "model",
        "default_generation_settings": {"n_ctx": spec.options.max_context, "params": generation_settings(entry)},
        "total_slots": spec.options.max_concurrency,
        "model_path": str(spec.path),
        "model_alias": spec.name,
        # What the model's engine was started with (--vision): llama-ui offers image attachments only then.
        "modalities": {"vision": spec.options.vision, "audio": False, "video": spec.options.vision},
        "chat_template": template.source if template is not None else "",  # "" until the model is loaded
        "status": _status(entry),
    }


@get("/props", raises=[ModelNotFoundError], summary="Server and model properties (the fields llama-ui reads)")
async def props(router: RouterDependency, model: FromQuery[str | None] = None,
                autoload: FromQuery[bool] = True) -> dict[str, Any]:
    common = {"build_info": f"ninfer {NINFER_VERSION}", "ui_settings": {}, "webui_settings": {},
              "cors_proxy_enabled": False, "agent_mode": False}
    several = len(router.entries) > 1
    if several and model is None:
        return {**common, "role": "router", "model_path": "", "model_alias": "", "total_slots": 0,
                "default_generation_settings": {"n_ctx": 0, "params": {}},
                "modalities": {"vision": False, "audio": False, "video": False}}
    entry = router.lookup(model)
    if autoload and entry.served is None:
        lease = await router.acquire(entry.name)
        await lease.release()
    return {**common, **_model_props(router, entry)}


def slot_rows(router: ModelRouter, entry: ModelEntry) -> list[dict[str, Any]]:
    """The lanes as the engine counts them (its busy lanes: the same figure /metrics and the KV counts follow), each
    busy one shown with a generation the engine still holds (one whose client left stays until the engine frees
    its lane)."""
    n_ctx = entry.spec.options.max_context
    lanes = entry.spec.options.max_concurrency
    busy = router.resident_stats().busy_lanes if entry.served is not None else 0
    running = [(call, g) for call in entry.lane_holders() for g in call.generations if g.holds_engine]
    slots = []
    for lane in range(lanes):
        call, gen = running[lane] if lane < min(busy, len(running)) else (None, None)
        slots.append({
            "id": lane, "n_ctx": n_ctx, "is_processing": gen is not None,
            "id_task": call.call_id if call is not None else -1,
            "request_id": gen.request_id if gen is not None else None,
            "conversation_id": call.conversation_id if call is not None else None,
            "n_prompt_tokens": gen.n_prompt if gen is not None else 0,
            "n_decoded": gen.n_decoded if gen is not None else 0,
            "n_prompt_tokens_cache": gen.n_cached if gen is not None else 0,  # served by the prefix cache
            "tokens": gen.n_prompt + gen.n_decoded if gen is not None else 0,
            "model": entry.name,
        })
    return slots


@get("/slots", raises=[ModelNotFoundError], summary="One object per configured lane of the model")
async def slots(router: RouterDependency, model: FromQuery[str | None] = None) -> list[dict[str, Any]]:
    return slot_rows(router, router.lookup(model))


# -- llama-swap ----------------------------------------------------------------------------------------------------


@get("/running", summary="llama-swap: the loaded and loading models")
async def running(router: RouterDependency) -> dict[str, Any]:
    rows = [{"model": e.name, "name": e.name, "state": SWAP_STATES.get(e.status, "stopped"), "cmd": "", "proxy": "",
             "ttl": router.effective_ttl(e), "description": e.spec.description}
            for e in router.entries if e.status in (LOADED, LOADING)]
    return {"running": rows}


@get("/unload", summary="llama-swap: unload everything (in-flight requests finish first)", media_type="text/plain")
async def unload_all(router: RouterDependency) -> Response[str]:
    router.request_unload(None)
    await asyncio.sleep(0)
    return Response("OK", media_type="text/plain")


route_handlers = [load_model, unload_model, models_sse, props, slots, running, unload_all]
