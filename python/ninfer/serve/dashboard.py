"""ninfer's `/dashboard`: a static page (webui/dashboard/ inside this package, so installs serve it too) over one
JSON route, `GET /dashboard/state`, which it polls once a second: per-model state, the resident engine's slots,
queue, KV and memory, the prefix cache's share of prompt tokens, the stream registry, recent errors (`router.errors`:
load failures, 429s of a full engine, generations ended by an engine error). Tokens/s is computed by the page from
successive `tokens_generated` readings, over a rolling window.

KV is reported twice: `in_use_tokens`, the tokens the running slots hold (prompt + decoded), and `reserved_tokens`,
the pool's pages taken (whole 64-token pages, reserved ahead for a request's growth). A model's `idle_s` is None while
it has requests in flight.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from litestar import Request, get
from litestar.static_files import create_static_files_router

from ninfer.serve.gate import RouterDependency
from ninfer.serve.llamacpp import slot_rows
from ninfer.serve.router import LOADING, ModelRouter
from ninfer.serve.streams import StreamRegistry
from ninfer.serve.webui_bundle import DASHBOARD_DIR



def _model_state(router: ModelRouter, now: float) -> list[dict[str, Any]]:
    return [{"name": e.name, "status": e.status, "failure": e.failure, "in_flight": e.pins,
             "ttl_s": router.effective_ttl(e), "idle_s": (now - e.last_used) if e.last_used and not e.pins else None,
             "load_progress": e.progress if e.status == LOADING else None, "waiting": e.waiting,
             "load_seconds": e.load_seconds, "path": str(e.spec.path), "max_context": e.spec.options.max_context,
             "lanes": e.spec.options.max_concurrency, "kv_dtype": e.spec.options.kv_dtype}
            for e in router.entries]


def _prefix_cache(router: ModelRouter) -> dict[str, Any]:
    """The server's counters of prompt and cached prompt tokens; `reuse`: some model runs with the prefix cache on
    (the page says whether the counters can grow)."""
    prompt, cached = router.metrics.prompt_token_totals()
    reuse = any(e.spec.options.prefix_cache for e in router.entries)
    return {"reuse": reuse, "prompt_tokens": prompt, "cached_prompt_tokens": cached}


def _kv(router: ModelRouter, slots: list[dict[str, Any]]) -> dict[str, Any]:
    stats = router.resident_stats()
    return {"in_use_tokens": sum(s["tokens"] for s in slots if s["is_processing"]),
            "reserved_tokens": stats.kv_capacity_tokens - stats.kv_free_tokens,
            "capacity_tokens": stats.kv_capacity_tokens}


@get("/dashboard/state", summary="What the dashboard shows (polled once a second)")
async def dashboard_state(router: RouterDependency, request: Request) -> dict[str, Any]:
    streams: StreamRegistry = request.app.state.streams
    resident = router.resident
    slots = slot_rows(router, resident) if resident is not None else []
    prompt_total, _ = router.metrics.prompt_token_totals()
    return {
        "time": time.time(),
        "uptime_s": time.time() - router.started,
        "resident": resident.name if resident is not None else None,
        "engine": asdict(router.resident_stats()),
        "models": _model_state(router, router.now()),
        "slots": slots,
        "kv": _kv(router, slots),
        "totals": {"generated_tokens": router.metrics.generated_token_total(), "prompt_tokens": prompt_total},
        "prefix_cache": _prefix_cache(router),
        "streams": {"count": len(streams), "bytes": streams.total_bytes},
        "errors": [{"time": t, "model": m, "message": msg} for t, m, msg in router.errors],
    }


dashboard_page = create_static_files_router(path="/dashboard", directories=[DASHBOARD_DIR], html_mode=True,
                                            opt={"public": True}, include_in_schema=False)

route_handlers = [dashboard_state, dashboard_page]
