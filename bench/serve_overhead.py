"""The server's added latency: time to first token and per streamed token, through `ninfer-serve` (SSE over loopback,
the whole Litestar/uvicorn/pipeline path) against direct `Engine.generate` calls, at 1 and 8 concurrent clients.

    .venv/bin/python bench/serve_overhead.py [ARTIFACT] [--tokens 64] [--out bench/results/serve_overhead.json]

Also recorded: CPU time per generated token of the serving process (engine threads included) in both modes; the
difference is the server's CPU cost per token, which, unlike latencies, does not depend on other load on the machine.

Same artifact, same greedy requests (`/v1/completions`, so no template and one prompt text per client), same engine
options; the two phases run one after the other so they never share the cores. Per-token time is the mean gap
between arrivals of generated text after the first; overhead = server - direct. Goal: < 1 ms per streamed token at
8 clients. Not a test: numbers depend on the machine and its load (recorded with the results).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams

MAX_CONCURRENCY = 8
MAX_CONTEXT = 1024


def _prompts(n: int) -> list[str]:
    return [f"Benchmark client {i} writes a long story about" for i in range(n)]


def _summary(runs: list[tuple[float, list[float]]]) -> dict[str, float]:
    """runs: (ttft_s, arrival times of text after the first) per client."""
    gaps = [b - a for _, arrivals in runs for a, b in itertools.pairwise(arrivals)]
    return {
        "ttft_ms": statistics.mean(t for t, _ in runs) * 1000,
        "per_token_ms": statistics.mean(gaps) * 1000 if gaps else float("nan"),
        "tokens": sum(len(a) for _, a in runs),
    }


async def _direct_one(engine: Engine, prompt: str, tokens: int) -> tuple[float, list[float]]:
    request = Request(
        engine.frontend.encode(prompt),
        SamplingParams(temperature=0.0),
        max_new_tokens=tokens,
        stop_token_ids=[],
    )
    start, arrivals = time.perf_counter(), []
    async for event in engine.generate(request):
        if event.token_ids:
            arrivals.append(time.perf_counter())
    return arrivals[0] - start, arrivals


async def _server_one(
    client: httpx.AsyncClient, url: str, prompt: str, tokens: int
) -> tuple[float, list[float]]:
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True}
    start, arrivals = time.perf_counter(), []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"text":""' not in line:
                arrivals.append(time.perf_counter())
    return arrivals[0] - start, arrivals


async def _direct(engine: Engine, clients: int, tokens: int) -> dict[str, float]:
    return _summary(await asyncio.gather(*(_direct_one(engine, p, tokens) for p in _prompts(clients))))


async def _server(url: str, clients: int, tokens: int) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=300) as client:
        return _summary(
            await asyncio.gather(*(_server_one(client, url, p, tokens) for p in _prompts(clients)))
        )


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measured(pid: int, run) -> dict[str, float]:
    before = _cpu_s(pid)
    summary = run()
    summary["cpu_ms_per_token"] = (_cpu_s(pid) - before) * 1000 / max(summary["tokens"], 1)
    return summary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(artifact: Path, threads: int) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ninfer.cli.serve",
            str(artifact),
            "--port",
            str(port),
            "--max-context",
            str(MAX_CONTEXT),
            "--max-concurrency",
            str(MAX_CONCURRENCY),
            "--threads",
            str(threads),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("ninfer-serve did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", nargs="?", help="default: the embedded SmolLM2 default model")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", default="bench/results/serve_overhead.json")
    args = parser.parse_args()
    if args.artifact is None:
        from ninfer.default_model import default_model_path

        args.artifact = str(default_model_path())
    artifact = Path(args.artifact)
    results: dict[str, dict] = {}
    with Engine.open_sync(
        artifact,
        EngineOptions(max_context=MAX_CONTEXT, max_concurrency=MAX_CONCURRENCY, threads=args.threads),
    ) as engine:
        asyncio.run(_direct(engine, 1, 4))  # warm-up
        for clients in (1, 8):
            results[f"direct_{clients}"] = _measured(
                os.getpid(), lambda c=clients: asyncio.run(_direct(engine, c, args.tokens))
            )
    process, url = _start_server(artifact, args.threads)
    try:
        asyncio.run(_server(url, 1, 4))  # warm-up
        for clients in (1, 8):
            results[f"server_{clients}"] = _measured(
                process.pid, lambda c=clients: asyncio.run(_server(url, c, args.tokens))
            )
    finally:
        process.terminate()
        process.wait(timeout=30)
    for clients in (1, 8):
        d, s = results[f"direct_{clients}"], results[f"server_{clients}"]
        results[f"overhead_{clients}"] = {
            "ttft_ms": s["ttft_ms"] - d["ttft_ms"],
            "per_token_ms": s["per_token_ms"] - d["per_token_ms"],
            "cpu_ms_per_token": s["cpu_ms_per_token"] - d["cpu_ms_per_token"],
        }
        print(
            f"{clients} client(s): TTFT {d['ttft_ms']:.1f} -> {s['ttft_ms']:.1f} ms, per token "
            f"{d['per_token_ms']:.2f} -> {s['per_token_ms']:.2f} ms (overhead "
            f"{results[f'overhead_{clients}']['per_token_ms']:+.2f} ms/token); CPU per token "
            f"{d['cpu_ms_per_token']:.2f} -> {s['cpu_ms_per_token']:.2f} ms"
        )
    record = {
        "artifact": artifact.name,
        "tokens_per_client": args.tokens,
        "max_concurrency": MAX_CONCURRENCY,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1m": os.getloadavg()[0],
        },
        "goal": "overhead < 1 ms per streamed token at 8 clients",
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
