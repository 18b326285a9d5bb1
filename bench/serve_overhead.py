"""The server's added latency: time to first token and per streamed token through the server (SSE over loopback, the
whole Litestar/uvicorn/pipeline path) against direct `Engine.generate` calls, at 1 and 8 concurrent clients.

    python bench/serve_overhead.py [--model ARTIFACT] [--backend cpu|cuda|auto] [--tokens 64] [--repeats 3]
                                   [--clients 1 8] [--profile FILE] [--out bench/results/serve_overhead.json]

Like with like:
- Both arms use one engine with the same options (`--backend`, `--threads`, lanes = the most clients), the same
  greedy requests (`/v1/completions` with one prompt text per client, so no template) and the same concurrency.
  The server arm runs the real app (ninfer.serve.app over the one-model router, as `ninfer-serve MODEL` serves it)
  in a child process started by this script (`--serve-child`), so the engine options are exactly the direct arm's.
- Each run is measured twice at once: at the client (arrival of each token's text: the SSE frame through the server,
  the engine event directly) and at the engine (its own timings of the same requests: time to first token, queue
  included, and the mean time per token after the first; through the server, read from its /metrics). The engine's
  figures absorb whatever load the machine had during that run, so `client - engine` is the latency the path between
  them adds, in the same run. The server's overhead is that figure through the server minus the same figure of
  direct calls (the asyncio pump, which both arms share). A machine whose load changes between the arms moves both
  the client and the engine figures, not their difference; the plain `server - direct` client figures are recorded
  too, and show that load.
- Runs alternate direct / server `--repeats` times (on the GPU the server child's engine is loaded only while its
  arm runs); figures are medians over the repeats.
- CPU per generated token of each process (`time` of all its threads): the serving process (engine included) and
  the client. The difference of the serving process's figures is the server's CPU cost per token, which does not
  depend on other load on the machine.
- `--profile FILE` profiles the server child's event loop thread (cProfile) during its runs: where the server's
  CPU per token goes.

On a GPU box: python bench/serve_overhead.py --backend cuda --model PATH.ninfer --tokens 128 \
    --out bench/results/serve_overhead_cuda.json
Goal: < 1 ms added per streamed token at 8 clients. Not a test: numbers depend on the machine and its load (recorded
with the results).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams

MAX_CONTEXT = 1024
STARTUP_TIMEOUT_S = 600.0  # a large model's load on a GPU box


def _prompts(n: int) -> list[str]:
    return [f"Benchmark client {i} writes a long story about" for i in range(n)]


@dataclass
class ClientRun:
    """One client's request as its client saw it."""

    ttft_s: float
    arrivals: list[float]  # when each piece of generated text arrived

    @property
    def per_token_s(self) -> float:
        return (self.arrivals[-1] - self.arrivals[0]) / (len(self.arrivals) - 1)


@dataclass
class EngineFigures:
    """The engine's own timings of a run's requests: summed over requests, as the server's /metrics holds them."""

    ttft_sum_s: float = 0.0
    per_token_sum_s: float = 0.0  # of each request's mean time per token after the first
    requests: int = 0

    def minus(self, before: EngineFigures) -> EngineFigures:
        return EngineFigures(self.ttft_sum_s - before.ttft_sum_s, self.per_token_sum_s - before.per_token_sum_s,
                             self.requests - before.requests)


def _run_summary(clients: list[ClientRun], engine: EngineFigures, cpu_s: dict[str, float]) -> dict[str, float]:
    frames = sum(len(c.arrivals) for c in clients)
    client_ttft = statistics.mean(c.ttft_s for c in clients)
    client_token = statistics.mean(c.per_token_s for c in clients)
    engine_ttft = engine.ttft_sum_s / engine.requests
    engine_token = engine.per_token_sum_s / engine.requests
    return {
        "client_ttft_ms": client_ttft * 1e3,
        "engine_ttft_ms": engine_ttft * 1e3,
        "added_ttft_ms": (client_ttft - engine_ttft) * 1e3,
        "client_per_token_ms": client_token * 1e3,
        "engine_per_token_ms": engine_token * 1e3,
        "added_per_token_ms": (client_token - engine_token) * 1e3,
        "frames": frames,
        **{f"{who}_cpu_ms_per_token": s * 1e3 / frames for who, s in cpu_s.items()},
    }


# -- the direct arm ------------------------------------------------------------------------------------------------


async def _direct_one(engine: Engine, prompt: str, tokens: int, figures: EngineFigures) -> ClientRun:
    # The model's own stop tokens, as the server's request has: greedy, both arms generate the same tokens.
    request = Request(engine.frontend.encode(prompt), SamplingParams(temperature=0.0), max_new_tokens=tokens)
    start, arrivals = time.perf_counter(), []
    generated = 0
    async for event in engine.generate(request):
        if event.token_ids:
            arrivals.append(time.perf_counter())
            generated += len(event.token_ids)
        if event.timings is not None:  # the final event: the figures the server records (ServedModel)
            figures.ttft_sum_s += event.timings.ttft_s
            figures.per_token_sum_s += (event.timings.total_s - event.timings.ttft_s) / max(generated - 1, 1)
            figures.requests += 1
    return ClientRun(arrivals[0] - start, arrivals)


def _direct(engine: Engine, clients: int, tokens: int) -> dict[str, float]:
    figures = EngineFigures()

    async def run() -> list[ClientRun]:
        return await asyncio.gather(*(_direct_one(engine, p, tokens, figures) for p in _prompts(clients)))

    before = _process_cpu_s(os.getpid())
    runs = asyncio.run(run())
    # One process: the engine, its pump and the clients (whose share is small: no HTTP, no parsing).
    return _run_summary(runs, figures, {"serving_process": _process_cpu_s(os.getpid()) - before})


# -- the server arm ------------------------------------------------------------------------------------------------


async def _server_one(client: httpx.AsyncClient, url: str, prompt: str, tokens: int) -> ClientRun:
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True}
    start, arrivals = time.perf_counter(), []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"text":""' not in line:
                arrivals.append(time.perf_counter())
    return ClientRun(arrivals[0] - start, arrivals)


def _metric_sums(url: str) -> EngineFigures:
    """The engine's timings the server recorded so far (ServedModel.record_generation)."""
    values: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        values[name] = float(value) if value and not name.startswith("#") else 0.0
    return EngineFigures(values.get("ninfer_time_to_first_token_seconds_sum", 0.0),
                         values.get("ninfer_time_per_output_token_seconds_sum", 0.0),
                         int(values.get("ninfer_time_per_output_token_seconds_count", 0)))


def _process_cpu_s(pid: int) -> float:
    """CPU seconds of a process's live threads, in nanoseconds (Linux schedstat: /proc/PID/stat counts 10 ms ticks,
    too coarse for a run of a few hundred tokens)."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total_ns += int((task / "schedstat").read_text().split()[0])
    return total_ns / 1e9


def _server(url: str, pid: int, clients: int, tokens: int) -> dict[str, float]:
    async def run() -> list[ClientRun]:
        async with httpx.AsyncClient(timeout=300) as client:
            return await asyncio.gather(*(_server_one(client, url, p, tokens) for p in _prompts(clients)))

    engine_before, server_before, client_before = _metric_sums(url), _process_cpu_s(pid), time.process_time()
    runs = asyncio.run(run())
    cpu = {"serving_process": _process_cpu_s(pid) - server_before, "client": time.process_time() - client_before}
    return _run_summary(runs, _metric_sums(url).minus(engine_before), cpu)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _server_child(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    port = _free_port()
    command = [sys.executable, __file__, "--serve-child", "--port", str(port), *_engine_argv(args)]
    if args.profile:
        command += ["--profile", args.profile]
    process = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server child did not start")
            time.sleep(0.2)
        yield url, process.pid
    finally:
        process.send_signal(signal.SIGINT)  # uvicorn shuts down; a profile is written then
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def _serve_child(args: argparse.Namespace) -> int:
    """The server arm's process: the real app over the one-model router, on an engine with the bench's options."""
    import uvicorn
    from ninfer.serve.app import create_app
    from ninfer.serve.router import ModelRouter
    from ninfer.serve.state import ServedModel

    engine = Engine.open_sync(args.model, _engine_options(args))

    async def open_router() -> ModelRouter:
        return ModelRouter.serving(ServedModel("bench", engine))

    server = uvicorn.Server(uvicorn.Config(create_app(open_router), host="127.0.0.1", port=args.port,
                                           log_level="warning"))
    # Timed by the thread's CPU clock: a loaded machine's preemptions do not show as time spent in a function.
    profiler = cProfile.Profile(time.thread_time) if args.profile else None
    if profiler is not None:
        profiler.enable()  # this thread runs the event loop: the server's own Python, engine threads aside
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT that stopped it
        pass
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        engine.close()
    return 0


# -- main ----------------------------------------------------------------------------------------------------------


def _engine_options(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(backend=args.backend, max_context=MAX_CONTEXT, max_concurrency=max(args.clients),
                         threads=args.threads)


def _engine_argv(args: argparse.Namespace) -> list[str]:
    return ["--model", str(args.model), "--backend", args.backend, "--threads", str(args.threads),
            "--clients", *map(str, args.clients)]


def _median_runs(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def _overheads(direct: dict[str, float], server: dict[str, float]) -> dict[str, float]:
    return {
        # what the server adds to what the same path adds directly, each measured against its own engine timings
        "ttft_ms": server["added_ttft_ms"] - direct["added_ttft_ms"],
        "per_token_ms": server["added_per_token_ms"] - direct["added_per_token_ms"],
        "serving_cpu_ms_per_token": server["serving_process_cpu_ms_per_token"]
        - direct["serving_process_cpu_ms_per_token"],
        # the plain comparison of client figures across the two arms (load changes between runs land here)
        "client_per_token_ms_server_minus_direct": server["client_per_token_ms"] - direct["client_per_token_ms"],
        "client_ttft_ms_server_minus_direct": server["client_ttft_ms"] - direct["client_ttft_ms"],
    }


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="an artifact (default: the embedded SmolLM2 default model)")
    parser.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=0, help="CPU backend threads (0: all cores)")
    parser.add_argument("--tokens", type=int, default=64, help="generated tokens per client")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", help="cProfile the server child's event loop thread into this file")
    parser.add_argument("--out", default="bench/results/serve_overhead.json")
    parser.add_argument("--serve-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model is None:
        from ninfer.default_model import default_model_path

        args.model = str(default_model_path())
    return args


def main() -> int:
    args = _parse_args()
    if args.serve_child:
        return _serve_child(args)
    runs: dict[str, list[dict[str, float]]] = {}
    load_before = os.getloadavg()
    for _ in range(args.repeats):
        # One engine at a time (a large model's weights fit the GPU once): the direct engine, then the server's.
        with Engine.open_sync(args.model, _engine_options(args)) as engine:
            _direct(engine, 1, 4)  # warm-up
            for clients in args.clients:
                runs.setdefault(f"direct_{clients}", []).append(_direct(engine, clients, args.tokens))
        with _server_child(args) as (url, pid):
            _server(url, pid, 1, 4)  # warm-up
            for clients in args.clients:
                runs.setdefault(f"server_{clients}", []).append(_server(url, pid, clients, args.tokens))
    results: dict[str, Any] = {name: _median_runs(r) for name, r in runs.items()}
    for clients in args.clients:
        d, s = results[f"direct_{clients}"], results[f"server_{clients}"]
        o = results[f"overhead_{clients}"] = _overheads(d, s)
        print(f"{clients} client(s): per token at the client {d['client_per_token_ms']:.2f} (direct) / "
              f"{s['client_per_token_ms']:.2f} (server) ms, at the engine {d['engine_per_token_ms']:.2f} / "
              f"{s['engine_per_token_ms']:.2f} ms -> the server adds {o['per_token_ms']:+.3f} ms per token and "
              f"{o['ttft_ms']:+.2f} ms to the first; serving CPU per token {o['serving_cpu_ms_per_token']:+.3f} ms")
    record = {
        "artifact": Path(args.model).name,
        "backend": args.backend,
        "tokens_per_client": args.tokens,
        "repeats": args.repeats,
        "max_concurrency": max(args.clients),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_average_1_5_15_before": load_before, "load_average_1_5_15_after": os.getloadavg()},
        "goal": "overhead < 1 ms per streamed token at 8 clients",
        "results": results,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
