"""End-to-end decode and prefill on the CUDA backend at the real Qwen3.5 shapes (synthetic weights, see
bench/synthetic.py), each decode figure against the roofline: the bytes one decode step must move (weights touched,
GDN states read and written, KV read) over the device read bandwidth measured in the same run. Prefill: TTFT and
prompt tokens/s of one request alone (after a warm-up prompt of the same length), with the engine's prefill chunk
(auto unless --prefill-chunk); --op-times adds the device time per backend op of the longest prefill
(EngineOptions.cuda_op_times, CUDA events around each op); --decode-op-times runs decode eagerly (no graphs) with
op timing, for the device time per op of one decode step.

    python bench/cuda_engine.py --model qwen3.5-27b --recipe groupwise-int --out bench/results/cuda_engine.json
    python bench/cuda_engine.py --model qwen3.5-27b --recipe fp8 --decode-batches --prefill 8192 --op-times \
        --out /tmp/fp8_prefill.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from cuda_kernels import measure_bandwidth, source_commit  # noqa: E402
from synthetic import MODELS, tensor_shapes, write_synthetic  # noqa: E402

from ninfer.artifact.reader import read_artifact  # noqa: E402
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams  # noqa: E402


def decode_step_bytes(artifact: Path, config: dict, batch: int, context: int) -> float:
    """Bytes one decode step moves: every weight once (the embedding only `batch` rows; for MoE only the routed
    experts: the expected share of distinct experts that `batch` rows of top_k uniform picks touch, plus the shared
    ones), each sequence's GDN state read and written, its KV read."""
    info = read_artifact(artifact)
    by_name = {t["name"]: sum(b["nbytes"] for b in t["blobs"].values()) for t in info.tensors}
    total = 0.0
    moe = config.get("moe")
    for name, nbytes in by_name.items():
        if name == "embed":
            total += nbytes / config["vocab_size"] * batch
        elif moe and ".moe.experts_" in name:
            total += nbytes * (1.0 - (1.0 - moe["top_k"] / moe["num_experts"]) ** batch)
        else:
            total += nbytes
    la = config["linear_attention"]
    linear_layers = config["layer_types"].count("linear_attention")
    full_layers = config["num_layers"] - linear_layers
    state = la["num_value_heads"] * 128 * 128 * 4 + (2 * la["num_key_heads"] + la["num_value_heads"]) * 128 * 3 * 4
    kv = full_layers * 2 * config["num_kv_heads"] * 256 * 2 * context  # bf16 K and V up to `context`
    return total + batch * (2 * linear_layers * state + kv)


def graph_pass_split(before: dict, after: dict) -> dict:
    """Decode graph figures between two memory_plan() readings: the captures in the window (count, mean host ms
    each: issuing the model's ops into the capture and instantiating or updating the executable), the replays
    (count, mean host ms per step: the model writing its step tables, their copy and the graph launch), the
    mean device ms per graph launch, and the MTP drafting passes' launches (count, mean device ms) apart."""
    def delta(key: str) -> float:
        return after[key] - before[key]

    captures, replays, passes = delta("graph_captures"), delta("graph_replays"), delta("graph_passes_timed")
    return {"captures": captures, "capture_host": delta("graph_capture_host_us") / max(captures, 1) / 1e3,
            "replays": replays, "replay_host": delta("graph_replay_host_us") / max(replays, 1) / 1e3,
            "passes": passes, "device": delta("graph_device_us") / max(passes, 1) / 1e3,
            "draft_passes": delta("graph_draft_passes"),
            "draft_device": delta("graph_draft_device_us") / max(delta("graph_draft_passes"), 1) / 1e3}


async def run_batch(engine: Engine, prompts: list[list[int]], new_tokens: int) -> list:
    async def one(prompt: list[int]):
        last = None
        async for event in engine.generate(Request(prompt, SamplingParams(temperature=0), max_new_tokens=new_tokens,
                                                   stop_token_ids=())):
            last = event
        return last

    return await asyncio.gather(*(one(p) for p in prompts))


def op_time_split(before: dict, after: dict) -> dict:
    """Device microseconds and calls per backend op between two memory_plan()["op_times"] readings."""
    split = {}
    for op, t in after.items():
        was = before.get(op, {"calls": 0, "device_us": 0.0})
        if t["calls"] > was["calls"]:
            split[op] = {"calls": t["calls"] - was["calls"], "device_us": t["device_us"] - was["device_us"]}
    return dict(sorted(split.items(), key=lambda kv: -kv[1]["device_us"]))


def elementwise_bytes(config: dict, rows: int) -> dict[str, float]:
    """Bytes the f32 elementwise and normalization ops of a dense Qwen3.5 model must move in a prefill of `rows`
    tokens (each operand read once, each output written once), per op name of the op-times split."""
    h, layers = config["hidden_size"], config["num_layers"]
    full = config["layer_types"].count("full_attention")
    linear = layers - full
    la = config["linear_attention"]
    qk, value = la["num_key_heads"] * la["key_head_dim"], la["num_value_heads"] * la["value_head_dim"]
    q, kv = config["num_heads"] * config["head_dim"], config["num_kv_heads"] * config["head_dim"]
    f = 4 * rows  # bytes per f32 column over every row
    out = {
        "add": 3 * h * f,                                       # the last layer's hidden += block out
        "add_rmsnorm": (2 * layers - 1) * 4 * h * f,            # every other residual add with the norm after it
        "rmsnorm": 2 * h * f + full * 2 * (q + kv) * f,         # the first layer's input norm; q/k head norms
        "sigmoid_gate": full * 3 * q * f,                       # attn *= sigmoid(gate)
        "gdn_conv_qkv": linear * 2 * (2 * qk + value) * f,      # mixed -> q, k, v
        "gated_rmsnorm": linear * 3 * value * f,                # out, z -> out
    }
    if config.get("intermediate_size"):
        out["swiglu"] = layers * 3 * config["intermediate_size"] * f  # gate, up -> gate
    return out


def bench(model: str, recipe: str, path: Path, bandwidth: float, prompt_len: int, new_tokens: int,
          prefill_lens: list[int], decode_batches: list[int], prefill_chunk: int, prefill_repeats: int,
          device_sampling: bool = True, cuda_gemm: str = "auto", op_times: bool = False,
          decode_op_times: bool = False) -> dict:
    started = time.perf_counter()
    reused = path.exists()  # an --artifact kept from an earlier run (e.g. the other arm of an A/B)
    if not reused:
        write_synthetic(model, recipe, path, progress=False)
    written_s = time.perf_counter() - started
    config = MODELS[model]
    rng = np.random.default_rng(0)
    result = {"model": model, "recipe": recipe, "artifact_bytes": path.stat().st_size, "write_s": written_s,
              "artifact_reused": reused,
              "decode": [], "prefill": []}
    options = EngineOptions(backend="cuda", max_context=max(prefill_lens + [prompt_len + new_tokens]) + 64,
                            max_concurrency=8, kv_capacity="auto", prefill_chunk=prefill_chunk,
                            verify_checksums=False, device_sampling=device_sampling, cuda_gemm=cuda_gemm,
                            cuda_op_times=op_times or decode_op_times, cuda_graphs=not decode_op_times)
    with Engine.open_sync(path, options) as engine:
        result["memory_plan"] = engine.memory_plan()
        for batch in decode_batches:
            prompts = [rng.integers(0, 200000, prompt_len).tolist() for _ in range(batch)]
            start_plan = engine.memory_plan()
            asyncio.run(run_batch(engine, prompts, 4))  # warm-up: graphs for this batch size
            before = engine.memory_plan()
            before_ops = before["op_times"]
            start = time.perf_counter()
            finals = asyncio.run(run_batch(engine, prompts, new_tokens))
            wall = time.perf_counter() - start
            after = engine.memory_plan()
            passes = graph_pass_split(before, after)
            passes["warm_up"] = graph_pass_split(start_plan, before)  # where this batch size's capture is
            per_seq = [f.timings.decode_tokens_per_s for f in finals]
            step_s = 1.0 / float(np.median(per_seq))
            moved = decode_step_bytes(path, config, batch, prompt_len + new_tokens // 2)
            result["decode"].append({
                "batch": batch, "prompt_tokens": prompt_len, "new_tokens": new_tokens,
                "tokens_per_s_per_seq": float(np.median(per_seq)), "aggregate_tokens_per_s": batch / step_s,
                "wall_s": wall, "bytes_per_step": moved, "roofline_step_s": moved / bandwidth,
                "fraction_of_roofline": (moved / bandwidth) / step_s, "graph_pass_ms": passes,
                "op_times": op_time_split(before_ops, after["op_times"]) if decode_op_times else {},
            })
        for length in prefill_lens:
            # The first prompt of a length grows scratch buffers and picks cuBLASLt algorithms for its shapes.
            asyncio.run(run_batch(engine, [rng.integers(0, 200000, length).tolist()], 1))
            ttfts, op_times = [], {}
            for _ in range(prefill_repeats):
                before = engine.memory_plan()["op_times"]
                (final,) = asyncio.run(run_batch(engine, [rng.integers(0, 200000, length).tolist()], 1))
                ttfts.append(final.timings.ttft_s)
                op_times = op_time_split(before, engine.memory_plan()["op_times"])
            ttft = float(np.median(ttfts))
            result["prefill"].append({"prompt_tokens": length, "ttft_s": ttft, "ttft_runs_s": ttfts,
                                      "prefill_tokens_per_s": length / ttft, "op_times": op_times})
    return result


def graph_line(g: dict) -> str:
    """The decode graph figures of one batch size: host time per replayed step (the timed run), host time per
    capture (taken once, in the warm-up; again only if the timed run had to recapture), device time per pass."""
    w = g["warm_up"]
    line = (f"replay host {g['replay_host'] * 1e3:.0f} us/step over {g['replays']} steps, device "
            f"{g['device']:.2f} ms/pass; capture {w['capture_host']:.2f} ms host x {w['captures']} in the warm-up")
    if g["captures"]:
        line += f", {g['captures']} more in the timed run ({g['capture_host']:.2f} ms each)"
    return line


def print_decode_op_times(d: dict) -> None:
    """Device time per decode step of each op (eager decode with op timing), longest first. The timed run's prompts
    are prefilled in it too (their linear_gemm calls; a few % of the other ops' time at the default lengths)."""
    if not d["op_times"]:
        return
    steps = d["new_tokens"]  # passes of the timed run: one per new token
    total = sum(t["device_us"] for t in d["op_times"].values())
    print(f"  device time per op per decode step, C={d['batch']}: {total / steps / 1e3:.2f} ms in ops")
    for op, t in sorted(d["op_times"].items(), key=lambda kv: -kv[1]["device_us"]):
        print(f"    {op:22s} {t['calls'] / steps:7.1f} calls {t['device_us'] / steps:9.1f} us "
              f"{t['device_us'] / t['calls']:7.1f} us/call {t['device_us'] / total:6.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--recipe", default="groupwise-int")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prefill", type=int, nargs="*", default=[1024])
    parser.add_argument("--host-sampling", action="store_true", help="copy logits and sample on the host (A/B)")
    parser.add_argument("--prefill-repeats", type=int, default=2, help="timed prompts per length (median)")
    parser.add_argument("--prefill-chunk", type=int, default=0, help="the engine's prefill chunk (0: auto)")
    parser.add_argument("--decode-batches", type=int, nargs="*", default=[1, 2, 4, 8],
                        help="decode concurrencies to run (none: prefill only)")
    parser.add_argument("--op-times", action="store_true",
                        help="time every backend op (EngineOptions.cuda_op_times); print the longest prefill's split")
    parser.add_argument("--decode-op-times", action="store_true",
                        help="decode without graphs, timing every op; print each batch size's device time per step")
    parser.add_argument("--cuda-gemm", choices=["auto", "twin", "streamed"], default="auto",
                        help="the prefill GEMM (EngineOptions.cuda_gemm): auto, the f32 twin for every weight, or "
                             "auto with the streamed int4/int8 GEMM at every row count")
    parser.add_argument("--artifact", type=Path, default=None,
                        help="keep the synthetic artifact here (written if missing, reused if present: A/B runs)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    assert tensor_shapes(MODELS[args.model])
    bandwidth = measure_bandwidth()["read"]
    commit = source_commit()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        path = args.artifact or Path(tmp) / f"{args.model}.{args.recipe}.ninfer"
        result = bench(args.model, args.recipe, path, bandwidth, args.prompt, args.new_tokens, args.prefill,
                       args.decode_batches, args.prefill_chunk, args.prefill_repeats,
                       device_sampling=not args.host_sampling, cuda_gemm=args.cuda_gemm, op_times=args.op_times,
                       decode_op_times=args.decode_op_times)
    from ninfer import _engine

    result |= {"device_sampling": not args.host_sampling, "device": _engine.cuda.device_name(), "commit": commit,
               "read_bandwidth_gb_per_s": bandwidth / 1e9, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{result['device']} {args.model} {args.recipe}: read BW {bandwidth / 1e9:.0f} GB/s, "
          f"artifact {result['artifact_bytes'] / 1e9:.1f} GB "
          f"{'reused' if result['artifact_reused'] else 'written'} in {result['write_s']:.0f} s")
    print(result["memory_plan"].get("summary", ""))
    for d in result["decode"]:
        print(f"decode C={d['batch']}: {d['tokens_per_s_per_seq']:.1f} tok/s/seq, {d['aggregate_tokens_per_s']:.1f} "
              f"aggregate, {d['fraction_of_roofline']:.1%} of roofline ({d['bytes_per_step'] / 1e9:.2f} GB/step); "
              f"graphs: {graph_line(d['graph_pass_ms'])}")
        print_decode_op_times(d)
    chunk = result["memory_plan"]["prefill_chunk"]
    for p in result["prefill"]:
        runs = ", ".join(f"{t * 1e3:.0f}" for t in p["ttft_runs_s"])
        print(f"prefill {p['prompt_tokens']} (chunk {chunk}): TTFT {p['ttft_s'] * 1e3:.0f} ms, "
              f"{p['prefill_tokens_per_s']:.0f} tok/s (runs: {runs} ms)")
    longest = max(result["prefill"], key=lambda p: p["prompt_tokens"], default=None)
    if longest and longest["op_times"]:
        total = sum(t["device_us"] for t in longest["op_times"].values())
        print(f"device time per op, prefill {longest['prompt_tokens']}: {total / 1e3:.1f} ms in ops "
              f"of {longest['ttft_s'] * 1e3:.0f} ms TTFT")
        moved = elementwise_bytes(MODELS[args.model], longest["prompt_tokens"])
        for op, t in longest["op_times"].items():
            rate = f" {moved[op] / t['device_us'] / 1e3:7.0f} GB/s" if op in moved and not MODELS[args.model]["moe"] \
                else ""
            print(f"  {op:22s} {t['calls']:6d} calls {t['device_us'] / 1e3:9.2f} ms {t['device_us'] / total:6.1%}"
                  f"{rate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
