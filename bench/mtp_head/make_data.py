"""CPU side of the SmolLM2 draft head's training (bench/mtp_head/README.md): conversations (the model's own answers
to the training prompts, and chunks of local text files as assistant turns), the model's final-normed hidden state
at every position of each, packed with what the device needs (the shortlist's embedding rows, the last layer's
weights as an initialisation) into one bundle small enough to carry to the device (64 MiB per call).

Run: .venv/bin/python bench/mtp_head/make_data.py --out DIR [--prompts 96] [--texts 150] [--max-new 160] [--seed 0]

Everything comes from the served artifact (the embedded default, Q4_1 blocks kept exactly), so the head is trained
on the hidden states the engine itself computes. Writes DIR/bundle.npz, DIR/config.json and DIR/data_report.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ninfer import _testing
from ninfer.artifact.convert import convert
from ninfer.artifact.gguf_file import GGUFFile
from ninfer.default_model import RECIPE, cache_dir, fetch_gguf
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from prompts import training_prompts  # bench/mtp_head/ is the script's directory

# The device's softmax runs over this many vocabulary rows (the carry limit: 49,152 Q8_0 rows are 30 MB): every
# token of the data, every token among the model's top 8 at any position, then the lowest ids (byte-level BPE
# assigns ids in merge order, a frequency ranking) up to the size. data_report.json records the teacher mass it holds.
SHORTLIST_ROWS = 16384
TOP_CANDIDATES = 8
SAMPLED_SHARE = 3  # every third prompt is answered with sampling (temperature 0.8, seeded), the rest greedily
INIT_LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                      "ffn_down")


def conversations(artifact: Path, prompts: list[tuple[str, str]], max_new: int,
                  seed: int) -> list[tuple[int, list[int]]]:
    """(prompt length, prompt + answer token ids) of each prompt, answered by the engine (8 lanes)."""
    engine = Engine.open_sync(artifact, EngineOptions(backend="cpu", max_concurrency=8, max_queue=len(prompts),
                                                      prefix_cache=False))
    try:
        encoded = [engine.frontend.encode(engine.frontend.render([{"role": "user", "content": p}],
                                                                 add_generation_prompt=True).text)
                   for _, p in prompts]

        done: list[int] = []

        async def answer(i: int, tokens: list[int]) -> tuple[int, list[int]]:
            sampled = i % SAMPLED_SHARE == SAMPLED_SHARE - 1  # as bundle["greedy"] records
            sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=seed + i) if sampled else SamplingParams(
                temperature=0)
            out: list[int] = []
            async for ev in engine.generate(Request(tokens, sampling, max_new_tokens=max_new)):
                out.extend(ev.token_ids)
            done.append(len(out))
            if len(done) % 16 == 0:
                print(f"answered {len(done)}/{len(encoded)} ({sum(done)} tokens)", file=sys.stderr, flush=True)
            return len(tokens), tokens + out

        async def main() -> list[tuple[int, list[int]]]:
            return await asyncio.gather(*(answer(i, t) for i, t in enumerate(encoded)))

        return asyncio.run(main())
    finally:
        engine.close()


def common_prefix(sequences: list[list[int]]) -> int:
    n = min(len(s) for s in sequences)
    first = sequences[0]
    return next((i for i in range(n) if any(s[i] != first[i] for s in sequences)), n)


def teacher_pass(artifact: Path, sequences: list[list[int]]) -> tuple[list[np.ndarray], dict[int, int], float]:
    """Each sequence's final-normed hidden rows [n, hidden] (f32), how often each token is among the top
    TOP_CANDIDATES, and the largest |hidden| value."""
    model = _testing.Model.open(str(artifact), max_context=4096)
    hidden, candidates, peak = [], {}, 0.0
    for tokens in sequences:
        seq = model.new_sequence()
        logits = model.prefill(seq, np.asarray(tokens, dtype=np.int32), all_logits=True)
        rows = np.asarray(model.hidden)
        model.release(seq)
        hidden.append(rows)
        peak = max(peak, float(np.abs(rows).max()))
        for t in np.argpartition(-logits, TOP_CANDIDATES, axis=1)[:, :TOP_CANDIDATES].ravel().tolist():
            candidates[t] = candidates.get(t, 0) + 1
    return hidden, candidates, peak


def shortlist(sequences: list[list[int]], candidates: dict[int, int], vocab: int) -> np.ndarray:
    chosen = {t for s in sequences for t in s} | set(candidates)
    for t in range(vocab):
        if len(chosen) >= SHORTLIST_ROWS:
            break
        chosen.add(t)
    return np.asarray(sorted(chosen)[:SHORTLIST_ROWS] if len(chosen) > SHORTLIST_ROWS else sorted(chosen), np.int32)


def shortlist_mass(artifact: Path, sequences: list[list[int]], rows: np.ndarray, sample: int) -> dict:
    """The teacher's probability mass inside the shortlist over the first `sample` sequences' positions (the
    teacher pass's own sequences: every token of them is in the shortlist, so this is an upper bound for text the
    shortlist was not chosen from)."""
    model = _testing.Model.open(str(artifact), max_context=4096)
    inside = np.zeros(model.config["vocab_size"], bool)
    inside[rows] = True
    masses = []
    for tokens in sequences[:sample]:
        seq = model.new_sequence()
        logits = model.prefill(seq, np.asarray(tokens, dtype=np.int32), all_logits=True).astype(np.float64)
        model.release(seq)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        masses.append(p[:, inside].sum(axis=1))
    m = np.concatenate(masses)
    return {"positions": int(m.size), "mean": float(m.mean()), "min": float(m.min()),
            "p01": float(np.quantile(m, 0.01))}


def gguf_blocks(gguf: Path, rows: np.ndarray, layer: int) -> dict[str, np.ndarray]:
    """The shortlist's Q8_0 embedding blocks and the layer's tensors as stored (Q4_1 bytes, f32 norms)."""
    reader = GGUFFile(gguf)
    by_name = {t.name: t for t in reader.tensors}
    embed = by_name["token_embd.weight"]
    assert embed.tensor_type.name == "Q8_0"
    out = {"embed_q8_0": np.ascontiguousarray(np.asarray(embed.data)[rows])}  # [rows, 18 blocks x 34 bytes]
    for name in INIT_LAYER_TENSORS:
        t = by_name[f"blk.{layer}.{name}.weight"]
        data = np.asarray(t.data)  # the file's bytes, a row per row
        out[f"init.{name}.{t.tensor_type.name}"] = data.view(np.float32).ravel() if t.tensor_type.name == "F32" else (
            np.ascontiguousarray(data))
    out["init.output_norm.F32"] = np.asarray(by_name["output_norm.weight"].data).view(np.float32).ravel()
    return out


def base_artifact() -> Path:
    """The default model as the engine serves it, without a head (the data must not depend on the head it trains):
    the GGUF converted as ninfer.default_model does, once, into the cache."""
    out = cache_dir() / "SmolLM2-135M-Instruct.Q4_1.ninfer"
    if not out.exists():
        convert(fetch_gguf(cache_dir(), progress=False), out, recipe=RECIPE, progress=False)
    return out


@dataclass
class Conversation:
    family: str  # chat | code | json
    source: str  # "answer" (the model's own) | "text" (a file's text as the assistant turn)
    prompt_len: int
    tokens: list[int]
    greedy: bool  # the answer is the model's greedy one (validation measures acceptance on these)


def _text_files(family: str) -> list[Path]:
    """Text on this machine for the `text` conversations: the Python standard library's modules (code), the JSON
    files and package descriptions (prose, `chat`) of the installed packages."""
    stdlib = Path(json.__file__).parent.parent
    site = Path(np.__file__).parent.parent
    if family == "code":
        return sorted(stdlib.glob("*.py"))
    if family == "json":
        return sorted(p for p in site.rglob("*.json") if 2_000 < p.stat().st_size < 200_000)
    return sorted(p for p in site.glob("*.dist-info/METADATA") if p.stat().st_size > 8_000)


TEXT_INSTRUCTIONS = {"code": "Show me some Python code.", "json": "Show me an example JSON document.",
                     "chat": "Tell me about a Python package."}


def text_conversations(frontend, counts: dict[str, int], max_tokens: int, seed: int) -> list[Conversation]:
    """Seeded chunks of local files as assistant turns after a fixed instruction per family."""
    rng = random.Random(seed)
    out = []
    for family, count in counts.items():
        files = _text_files(family)
        prompt = frontend.encode(frontend.render([{"role": "user", "content": TEXT_INSTRUCTIONS[family]}],
                                                 add_generation_prompt=True).text)
        for _ in range(count):
            text = rng.choice(files).read_text(errors="replace")
            if family == "chat":
                text = text.split("\n\n", 1)[-1]  # past the metadata headers
            lines = text.splitlines(keepends=True)
            first = rng.randrange(max(1, len(lines) - 40)) if family != "json" else 0
            body = frontend.encode("".join(lines[first:first + 80]))[:max_tokens]
            out.append(Conversation(family, "text", len(prompt), prompt + body, greedy=False))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=96, help="training prompts the model answers")
    ap.add_argument("--texts", type=int, default=150, help="file-text conversations (code, json, prose: 2:1:1)")
    ap.add_argument("--max-new", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-positions", type=int, default=38000, help="hidden rows to keep (the carry budget)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    artifact = base_artifact()
    config = json.loads(json.dumps(_testing.Model.open(str(artifact), max_context=64).config))

    start = time.perf_counter()
    prompts = training_prompts(args.prompts, args.seed)
    answered = conversations(artifact, prompts, args.max_new, args.seed)
    generated_s = time.perf_counter() - start
    convs = [Conversation(f, "answer", n, s, greedy=i % SAMPLED_SHARE != SAMPLED_SHARE - 1)
             for i, ((f, _), (n, s)) in enumerate(zip(prompts, answered, strict=True))]
    with Engine.open_sync(artifact, EngineOptions(backend="cpu")) as engine:
        texts = text_conversations(engine.frontend, {"code": args.texts // 2, "json": args.texts // 4,
                                                     "chat": args.texts - args.texts // 2 - args.texts // 4},
                                   args.max_new, args.seed)
    # Answers first, then texts, until the budget; the shared system-prompt prefix's rows are stored once.
    everything = convs + texts
    prefix = common_prefix([c.tokens for c in everything])
    kept, rows_total = [], prefix
    for c in everything:
        if rows_total + len(c.tokens) - prefix > args.max_positions:
            break
        kept.append(c)
        rows_total += len(c.tokens) - prefix
    sequences = [c.tokens for c in kept]
    hidden, candidates, peak = teacher_pass(artifact, sequences)
    rows = shortlist(sequences, candidates, int(config["vocab_size"]))
    mass = shortlist_mass(artifact, sequences[:12] + sequences[-12:], rows, sample=24)

    lengths = np.asarray([len(s) for s in sequences], np.int32)
    bundle = {
        "tokens": np.concatenate([np.asarray(s, np.int32) for s in sequences]),
        "lengths": lengths,
        "greedy": np.asarray([c.greedy for c in kept]),
        "prompt_lengths": np.asarray([c.prompt_len for c in kept], np.int32),
        "families": np.asarray([["chat", "code", "json"].index(c.family) for c in kept], np.int8),
        "prefix_hidden": hidden[0][:prefix].astype(np.float16),
        "hidden": np.concatenate([h[prefix:] for h in hidden]).astype(np.float16),
        "shortlist": rows,
        **gguf_blocks(fetch_gguf(cache_dir(), progress=False), rows, int(config["num_layers"]) - 1),
    }
    np.savez(args.out / "bundle.npz", **bundle)
    (args.out / "config.json").write_text(json.dumps(config, indent=1))
    answers = [c for c in kept if c.source == "answer"]
    report = {
        "artifact": artifact.name, "seed": args.seed, "prompts_answered": len(convs), "max_new_tokens": args.max_new,
        "sampled_share": f"1/{SAMPLED_SHARE}", "generation_s": round(generated_s, 1),
        "answers_kept": len(answers), "answer_tokens": sum(len(c.tokens) - c.prompt_len for c in answers),
        "texts_kept": len(kept) - len(answers),
        "text_tokens": sum(len(c.tokens) - c.prompt_len for c in kept if c.source == "text"),
        "positions": int(lengths.sum()), "shared_prefix": prefix, "hidden_rows_stored": int(rows_total),
        "hidden_abs_max": peak, "shortlist_rows": int(rows.size), "shortlist_teacher_mass": mass,
        "bundle_bytes": (args.out / "bundle.npz").stat().st_size,
    }
    (args.out / "data_report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
