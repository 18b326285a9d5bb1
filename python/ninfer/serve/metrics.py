"""Prometheus metrics: one registry per app (so tests can run several apps in one process).

Counted where the facts are: requests by the ASGI middleware below (route and status), tokens and latencies by
`ServedModel.record_generation` at the end of each generation, and engine gauges (queue, lanes, KV) read from
`engine.stats()` at scrape time by a custom collector, so they are never stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ninfer.engine import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The `_created` timestamps double every series and no dashboard reads them.
disable_created_metrics()

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        yield GaugeMetricFamily("ninfer_lanes", "Engine lanes (max concurrency)", value=s.lanes)
        yield GaugeMetricFamily("ninfer_lanes_busy", "Lanes running a request", value=s.busy_lanes)
        yield GaugeMetricFamily("ninfer_queue_requests", "Requests waiting for a lane", value=s.queued)
        yield GaugeMetricFamily(
            "ninfer_kv_capacity_tokens", "Tokens the KV pool holds", value=s.kv_capacity_tokens
        )
        yield GaugeMetricFamily("ninfer_kv_free_tokens", "Free tokens in the KV pool", value=s.kv_free_tokens)
        yield GaugeMetricFamily(
            "ninfer_resident_bytes", "Resident memory of the engine", value=s.resident_bytes
        )
        yield CounterMetricFamily(
            "ninfer_draft_tokens", "Speculative decoding: MTP drafts verified by the engine", value=s.draft_tokens
        )
        yield CounterMetricFamily(
            "ninfer_draft_tokens_accepted", "Speculative decoding: MTP drafts the engine accepted",
            value=s.draft_tokens_accepted,
        )
        p = s.prefix
        yield GaugeMetricFamily("ninfer_prefix_cache_blocks", "64-token KV blocks in the prefix cache",
                                value=p.cached_blocks)
        yield GaugeMetricFamily("ninfer_prefix_cache_snapshots", "Gated DeltaNet state snapshots in the prefix cache",
                                value=p.cached_snapshots)
        yield GaugeMetricFamily("ninfer_prefix_cache_host_blocks", "64-token KV blocks in the host tier",
                                value=p.host_blocks)
        yield GaugeMetricFamily("ninfer_prefix_cache_host_snapshots", "State snapshots in the host tier",
                                value=p.host_snapshots)
        # Counters since the resident engine opened (a swapped model starts again from 0).
        for name, doc, value in (
            ("lookups", "Admissions that looked for a cached prefix", p.lookups),
            ("hits", "Admissions that reused a cached prefix", p.hits),
            ("cached_tokens", "Prompt tokens reused from the prefix cache", p.cached_tokens),
            ("restores", "State snapshots restored into a lane (device tier)", p.restores),
            ("evicted_blocks", "KV blocks evicted from the prefix cache (device tier)", p.evicted_blocks),
            ("evicted_snapshots", "State snapshots evicted from the prefix cache (device tier)", p.evicted_snapshots),
            ("host_stored_blocks", "KV blocks the device tier moved to the host tier", p.host_stored_blocks),
            ("host_stored_snapshots", "State snapshots the device tier moved to the host tier",
             p.host_stored_snapshots),
            ("host_restored_blocks", "KV blocks restored from the host tier", p.host_restored_blocks),
            ("host_restored_snapshots", "State snapshots restored into a lane from the host tier",
             p.host_restored_snapshots),
            ("host_evicted_blocks", "KV blocks evicted from the host tier (GDSF)", p.host_evicted_blocks),
            ("host_evicted_snapshots", "State snapshots evicted from the host tier (GDSF)", p.host_evicted_snapshots),
        ):
            yield CounterMetricFamily(f"ninfer_prefix_cache_{name}", doc, value=value)


class ServerMetrics:
    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "ninfer_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.prompt_tokens = Counter(
            "ninfer_prompt_tokens", "Prompt tokens of finished generations", registry=r
        )
        self.cached_tokens = Counter(
            "ninfer_cached_prompt_tokens", "Prompt tokens served from the cache", registry=r
        )
        self.generated_tokens = Counter("ninfer_generated_tokens", "Generated tokens", registry=r)
        self.generations = Counter(
            "ninfer_generations", "Finished generations by finish reason", ["finish_reason"], registry=r
        )
        self.ttft = Histogram(
            "ninfer_time_to_first_token_seconds",
            "Time to first token, queue included",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.token_latency = Histogram(
            "ninfer_time_per_output_token_seconds",
            "Mean time between generated tokens of one generation",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.disconnect_release = Histogram(
            "ninfer_disconnect_release_seconds",
            "From the server seeing a client disconnect to the engine lane (or queue place) of its generation being "
            "free",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        r.register(_EngineCollector(stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def prompt_token_totals(self) -> tuple[int, int]:
        """(prompt tokens, of which served from the prefix cache) of the generations finished so far: the counters
        /metrics exports, for the dashboard."""
        return _total(self.prompt_tokens), _total(self.cached_tokens)

    def generated_token_total(self) -> int:
        """Tokens generated by the generations finished so far, every model together (the dashboard's total)."""
        return _total(self.generated_tokens)


def _total(counter: Counter) -> int:
    """An unlabelled counter's value, read through its public collect()."""
    return int(next(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")))


class RequestCounter:
    """ASGI middleware counting HTTP requests by matched route (bounded label set) and status code."""

    def __init__(self, app: Any, metrics_of: Callable[[Any], ServerMetrics | None]) -> None:
        self._app = app
        self._metrics_of = metrics_of

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        status = {"code": 500}

        async def recording_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self._app(scope, receive, recording_send)
        finally:
            metrics = self._metrics_of(scope)
            if metrics is not None:
                # The matched route's template (bounded label set; one per path a handler is mounted at).
                route = scope.get("path_template") or "unmatched"
                metrics.requests.labels(route=route, status=str(status["code"])).inc()
