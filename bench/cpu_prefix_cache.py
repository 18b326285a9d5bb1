"""Prefix reuse on the CPU: a multi-turn agent session (a system prompt with tools, then turns of user text and an
answer, each turn's prompt the whole conversation so far) with reuse and without; its resume from the host tier
after the device tier evicted it, and after the engine was closed and opened again (a router swap); 8 users sharing
a system prompt. Time to first token of every turn and the prompt tokens each turn reused.

Run: .venv/bin/python bench/cpu_prefix_cache.py [--artifact PATH] [--system N] [--turns T] [--user N]
         [--answer N] [--generate N] [--threads N] [--out bench/results/cpu_prefix_cache.json]

The issue's session is --system 4096 --turns 20 --user 1024 --answer 300 (32k tokens of context); the defaults are a
short one for a loaded CPU. The default artifact is the embedded default model (SmolLM2-135M, a plain decoder: KV
blocks reused at any block boundary); give a Qwen3.5 artifact (e.g. a tiny one from the test cache) for the hybrid
path with state snapshots. Token ids are random (the cost of a prefill does not depend on them). Of each answer the
first --generate tokens are generated, the rest are random tokens the client sends back as the answer (the next
turn's prompt reuses up to the answer's start, as with Qwen3.5's template, which drops past reasoning). "No reuse"
is a prompt of the same length with other random tokens in the same engine: nothing of it is cached. TTFT is the
engine's own (submit to first token). bench/cuda_prefix_cache.py runs the same scenarios on the H200. Not a test:
figures depend on the machine and its load (recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from ninfer.engine import Engine, EngineOptions, Request, SamplingParams

# A session's shape: the agent session, and the short CPU default.
FULL = {"system": 4096, "turns": 20, "user": 1024, "answer": 300}
SHORT = {"system": 1024, "turns": 6, "user": 256, "answer": 64}
# run_scenarios' turns after the session: resumed from the device, from the host tier, after a reopen.
RESUMED_TURNS = 3


async def _one(engine: Engine, prompt: list[int], generate: int) -> tuple[list[int], float, int]:
    tokens: list[int] = []
    last = None
    request = Request(prompt, SamplingParams(temperature=0), max_new_tokens=generate, stop_token_ids=())
    async for ev in engine.generate(request):
        tokens.extend(ev.token_ids)
        last = ev
    assert last is not None and last.usage is not None and last.timings is not None
    return tokens, last.timings.ttft_s, last.usage.cached_tokens


def turn(engine: Engine, prompt: list[int], generate: int) -> tuple[list[int], float, int]:
    """(generated tokens, TTFT s, cached tokens) of one request."""
    return asyncio.run(_one(engine, prompt, generate))


def random_tokens(rng: np.random.Generator, engine: Engine, n: int) -> list[int]:
    return rng.integers(3, engine.info.vocab_size, n).tolist()


def agent_session(engine: Engine, rng: np.random.Generator, shape: dict, generate: int,
                  uncached_every: int) -> tuple[list[dict], list[int]]:
    """The session's turns: TTFT with reuse, and every `uncached_every`-th turn (and the last) a prompt of the same
    length with nothing cached and one of the turn's new tokens alone. Returns the rows and the conversation so far."""
    conversation = random_tokens(rng, engine, shape["system"])
    rows = []
    for t in range(1, shape["turns"] + 1):
        conversation += random_tokens(rng, engine, shape["user"])
        answer, ttft, cached = turn(engine, conversation, generate)
        row = {"turn": t, "prompt_tokens": len(conversation), "cached_tokens": cached,
               "new_tokens": len(conversation) - cached, "ttft_ms_reuse": round(ttft * 1e3, 2)}
        if uncached_every and (t % uncached_every == 1 or t == shape["turns"]):
            _, ttft_off, cached_off = turn(engine, random_tokens(rng, engine, len(conversation)), 1)
            assert cached_off == 0
            row["ttft_ms_no_reuse"] = round(ttft_off * 1e3, 2)
            # A prompt of only the turn's new tokens: their prefill without the cached prefix to attend to (a lower
            # bound of what the reused turn computes: its new tokens also attend to the prefix).
            _, ttft_new, _ = turn(engine, random_tokens(rng, engine, row["new_tokens"]), 1)
            row["ttft_ms_new_tokens_only"] = round(ttft_new * 1e3, 2)
        rows.append(row)
        conversation += answer + random_tokens(rng, engine, shape["answer"] - len(answer))
    return rows, conversation


def restored_bytes(engine: Engine, before: dict, after: dict) -> int:
    plan = engine.memory_plan()
    return ((after["host_restored_blocks"] - before["host_restored_blocks"]) * plan["host_kv_page_bytes"]
            + (after["host_restored_snapshots"] - before["host_restored_snapshots"]) * plan["host_state_slot_bytes"])


def prefix_stats(engine: Engine) -> dict:
    return asdict(engine.stats().prefix)


def resumed_turn(engine: Engine, rng: np.random.Generator, conversation: list[int], shape: dict,
                 generate: int) -> tuple[dict, list[int]]:
    """One more turn of the session (its user text after `conversation`): what it reused, its TTFT, the host bytes
    it restored. Returns the row and the conversation with this turn's answer (random tokens) after it."""
    before = prefix_stats(engine)
    prompt = conversation + random_tokens(rng, engine, shape["user"])
    _, ttft, cached = turn(engine, prompt, generate)
    after = prefix_stats(engine)
    row = {"prompt_tokens": len(prompt), "cached_tokens": cached, "new_tokens": len(prompt) - cached,
           "ttft_ms": round(ttft * 1e3, 2), "restored_bytes": restored_bytes(engine, before, after),
           "host_restored_blocks": after["host_restored_blocks"] - before["host_restored_blocks"],
           "host_restored_snapshots": after["host_restored_snapshots"] - before["host_restored_snapshots"]}
    return row, prompt + random_tokens(rng, engine, shape["answer"])


def evict_to_host(engine: Engine, rng: np.random.Generator, tokens: int) -> dict:
    """Unrelated prompts of `tokens` tokens in all, so that the device tier moves the session to the host tier."""
    before = prefix_stats(engine)
    longest = engine.info.max_context - 64
    while tokens > 0:
        turn(engine, random_tokens(rng, engine, min(tokens, longest)), 1)
        tokens -= longest
    after = prefix_stats(engine)
    return {k: after[k] - before[k] for k in ("host_stored_blocks", "host_stored_snapshots", "evicted_blocks")}


async def _together(engine: Engine, prompts: list[list[int]]) -> list[tuple[list[int], float, int]]:
    return await asyncio.gather(*(_one(engine, p, 1) for p in prompts))


def shared_prompt_users(engine: Engine, rng: np.random.Generator, shape: dict, users: int = 8) -> dict:
    """`users` requests at once, each a shared system prompt (cached by an earlier request) and its own user text;
    then the same with a different system prompt each (nothing to share)."""
    system = random_tokens(rng, engine, shape["system"])
    turn(engine, system + random_tokens(rng, engine, 8), 1)  # it is cached now
    shared = asyncio.run(_together(engine, [system + random_tokens(rng, engine, shape["user"])
                                            for _ in range(users)]))
    alone = asyncio.run(_together(engine, [random_tokens(rng, engine, shape["system"] + shape["user"])
                                           for _ in range(users)]))
    return {"users": users, "prompt_tokens": shape["system"] + shape["user"],
            "cached_tokens": [c for _, _, c in shared],
            "ttft_ms_shared": [round(t * 1e3, 2) for _, t, _ in shared],
            "ttft_ms_unshared": [round(t * 1e3, 2) for _, t, _ in alone]}


def run_scenarios(open_engine: Callable[..., Engine], options: EngineOptions, shape: dict, generate: int,
                  uncached_every: int, seed: int) -> dict:
    """Every scenario on engines `open_engine(options, host_tier=None)` makes: the session, its resume from the
    host tier after an eviction, after a close and reopen (a router swap), and the shared prompt. The device tier
    holds one full context (and one snapshot per lane) beyond the lanes' own: the eviction scenario overflows it."""
    rng = np.random.default_rng(seed)
    result: dict = {"session": shape, "generate": generate}
    engine = open_engine(options)
    try:
        result["memory_plan"] = engine.memory_plan()["summary"]
        result["turns"], conversation = agent_session(engine, rng, shape, generate, uncached_every)
        # Each resumed turn computes about as much as a session turn (the last answer, new user text): TTFT from
        # the host minus TTFT from the device is the restore's time.
        result["resume_device"], conversation = resumed_turn(engine, rng, conversation, shape, generate)
        result["eviction"] = evict_to_host(engine, rng, options.kv_capacity)
        result["resume_host"], result["resume_host_sibling"], conversation = restored_turn(
            engine, rng, conversation, shape, generate)
        result["shared_prompt"] = shared_prompt_users(engine, rng, shape)
        tier = engine.host_tier
    finally:
        engine.close()
    engine = open_engine(options, host_tier=tier)
    try:
        result["resume_after_reopen"], result["resume_after_reopen_sibling"], _ = restored_turn(
            engine, rng, conversation, shape, generate)
    finally:
        engine.close()
    for case in ("resume_host", "resume_after_reopen"):
        result[f"{case}_gb_per_s"] = restore_rate(result[case], result[f"{case}_sibling"])
    return result


def restored_turn(engine: Engine, rng: np.random.Generator, conversation: list[int], shape: dict,
                  generate: int) -> tuple[dict, dict, list[int]]:
    """A resumed turn whose prefix is on the host tier, then its sibling: the same conversation with other user
    text of the same length, whose prefix is on the device by then (the first restored it). The two compute the
    same, so their TTFTs differ by the restore. Returns both rows and the first's conversation."""
    row, after = resumed_turn(engine, rng, conversation, shape, generate)
    sibling, _ = resumed_turn(engine, rng, conversation, shape, generate)
    return row, sibling, after


def restore_rate(host: dict, sibling: dict) -> float | None:
    """GB/s of the bytes the first turn restored from the host tier beyond its sibling's (a host snapshot stays
    on the host: both may restore it) over the TTFT they added; None when they added nothing measurable."""
    added_s = (host["ttft_ms"] - sibling["ttft_ms"]) / 1e3
    restored = host["restored_bytes"] - sibling["restored_bytes"]
    return round(restored / added_s / 1e9, 2) if added_s > 0 and restored > 0 else None


def session_options(shape: dict, lanes: int = 8, **kw) -> EngineOptions:
    """Room for the session's longest prompt per lane, one more context's worth of cached blocks, and a host tier
    for two sessions; state slots for the lanes and 8 snapshots. The longest prompt is the last of the three
    resumed turns (run_scenarios) after the session's own, each a user text and an answer more."""
    context = shape["system"] + (shape["turns"] + RESUMED_TURNS) * (shape["user"] + shape["answer"]) + 128
    context = -(-context // 64) * 64
    return replace(EngineOptions(max_context=context, kv_capacity=context * 2, max_concurrency=lanes,
                                 decision_lanes=0, device_state_slots=lanes + 8, host_state_slots=16), **kw)


def commit_sha() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()


def main() -> None:
    from cpu_linear import cpu_name  # bench/ is the script's directory

    from ninfer.default_model import default_model_path

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", type=Path)
    for key, value in SHORT.items():
        p.add_argument(f"--{key}", type=int, default=value)
    p.add_argument("--generate", type=int, default=4, help="answer tokens generated per turn (the rest random)")
    p.add_argument("--uncached-every", type=int, default=2, help="a no-reuse prompt every N turns (0: none)")
    p.add_argument("--host-kv-mib", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    path = args.artifact or default_model_path(progress=False)
    shape = {k: getattr(args, k) for k in SHORT}
    options = session_options(shape, lanes=8, backend="cpu", threads=args.threads, host_kv_mib=args.host_kv_mib)

    def open_engine(o: EngineOptions, host_tier=None) -> Engine:
        return Engine(path, o, host_tier=host_tier)

    result = {"artifact": str(path), "cpu": cpu_name(), "threads": args.threads, "load_average": os.getloadavg(),
              "commit": commit_sha(),
              **run_scenarios(open_engine, options, shape, args.generate, args.uncached_every, args.seed)}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
