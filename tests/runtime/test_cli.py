"""The `ninfer` CLI on the real SmolLM2 model (the embedded default) and `ninfer perplexity` against HF."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_reference import llama_reference

from ninfer.engine import Engine, EngineOptions

# The installed console script, as users run it (`python -m ninfer.cli.main` would load main.py twice).
NINFER = [str(Path(sys.executable).parent / "ninfer")]


def ninfer(*args: str, cache_home: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if cache_home is not None:
        env["XDG_CACHE_HOME"] = str(cache_home)
    return subprocess.run([*NINFER, *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_default_model_answers_the_capital_of_france(smollm2_cache_home):
    result = ninfer("--prompt", "What is the capital of France?", "--temperature", "0", "--max-new", "24",
                    cache_home=smollm2_cache_home)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "decode" in result.stderr and "tok/s" in result.stderr and "TTFT" in result.stderr
    assert "MiB" in result.stderr


def test_messages_file_and_sampling_options(smollm2_default_artifact, tmp_path):
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "system", "content": "Answer in one word."},
                                    {"role": "user", "content": "What is the capital of France?"}]))
    args = (str(smollm2_default_artifact), "--messages", str(messages), "--max-new", "16", "--temperature", "0.7",
            "--top-p", "0.9", "--top-k", "40", "--seed", "11", "--kv-dtype", "bf16", "--no-think")
    first, second = ninfer(*args), ninfer(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and first.stdout.strip()  # seeded: reproducible


@pytest.mark.parametrize(("args", "message"), [
    (("--prompt", "x", "--messages", "y"), "not allowed with argument"),
    (("/no/such/model.ninfer", "--prompt", "x"), "model file not found: /no/such/model.ninfer"),
    (("MODEL", "--messages", "/no/such.json"), "cannot read --messages file"),
    (("MODEL", "--prompt", "x", "--max-new", "0"), "--max-new must be >= 1"),
    (("MODEL", "--prompt", "x", "--top-p", "1.5"), "top_p = 1.5"),
    (("MODEL", "--prompt", "x", "--max-context", "8"), "the prompt has"),
    (("MODEL",), "give --prompt TEXT or --messages FILE"),
])
def test_option_errors_are_one_line(smollm2_default_artifact, args, message):
    args = tuple(str(smollm2_default_artifact) if a == "MODEL" else a for a in args)
    result = ninfer(*args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert message in lines[-1] and lines[-1].startswith("ninfer")
    assert "Traceback" not in result.stderr


def windowed_nll(model, tokens: list[int], context: int) -> tuple[float, int]:
    """Summed negative log-likelihood and scored-token count over non-overlapping windows, as `ninfer perplexity`."""
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(tokens), context):
            window = tokens[start:start + context]
            if len(window) < 2:
                continue
            logits = model(torch.tensor([window])).logits[0].double()
            lp = torch.log_softmax(logits, -1)[torch.arange(len(window) - 1), torch.tensor(window[1:])]
            nll -= lp.sum().item()
            count += len(window) - 1
    return nll, count


def test_perplexity_matches_transformers(smollm2_bf16_artifact, jargon_text, tmp_path):
    # ~400 tokens in windows of 128: three full windows and a partial one, small enough for a fast test.
    context = 128
    text_file = tmp_path / "jargon.txt"
    text_file.write_text(jargon_text[20000:21700], encoding="utf-8")
    result = ninfer("perplexity", str(smollm2_bf16_artifact), "--text-file", str(text_file), "--context",
                    str(context), "--json")
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert math.isfinite(got["perplexity"]) and 1 < got["perplexity"] < 200

    with Engine.open_sync(smollm2_bf16_artifact, EngineOptions(max_context=context)) as engine:
        tokens = engine.frontend.encode(text_file.read_text(encoding="utf-8"))
    # HF LlamaForCausalLM on the artifact's own weights (the GGUF's values rounded to bf16 by the conversion).
    # One torch thread: on the shared 2-core machine two threads wait on each other (a 128-token window took 16 s
    # with 2 threads and 2 s with 1 at load 8).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        nll, count = windowed_nll(llama_reference(smollm2_bf16_artifact), tokens, context)
    finally:
        torch.set_num_threads(threads)
    assert got["scored_tokens"] == count
    assert got["perplexity"] == pytest.approx(math.exp(nll / count), rel=2e-3)
