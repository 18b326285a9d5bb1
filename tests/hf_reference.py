"""HF transformers reference models built from an artifact's own (dequantized) weights.

API:
    llama_reference(artifact_path) -> transformers LlamaForCausalLM (fp32, eval mode)
        For a plain llama artifact (e.g. SmolLM2 converted from its GGUF). The GGUF keeps llama's q/k rows
        permuted for interleaved RoPE pairing and the artifact says `pairing: interleaved`; HF rotates halves,
        so q/k rows are un-permuted (pairs (2j, 2j+1) -> (j, j + D/2)) on the way in. Building the model this
        way takes seconds, where HF's own GGUF loader takes minutes for the same values.
    interleaved_to_half(w, heads) -> the rows of each head reordered from interleaved to half pairing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ninfer import _engine


def interleaved_to_half(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each head reordered from pairs (2j, 2j+1) to (j, j + D/2)."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def llama_reference(artifact_path: Path | str):
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.initialization import no_init_weights

    art = _engine.Artifact.open(str(artifact_path))
    c = json.loads(art.manifest_json())["config"]
    assert c["rope"]["pairing"] == "interleaved"
    config = LlamaConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                         intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_layers"],
                         num_attention_heads=c["num_heads"], num_key_value_heads=c["num_kv_heads"],
                         head_dim=c["head_dim"], rms_norm_eps=c["rms_norm_eps"],
                         rope_parameters={"rope_type": "default", "rope_theta": c["rope"]["theta"]},
                         tie_word_embeddings=c["tie_word_embeddings"], max_position_embeddings=2048)
    with no_init_weights():  # every weight is loaded below; a random init of 135 M values would take seconds
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
    model.load_state_dict(state, strict=True, assign=True)  # no copy: the model keeps these tensors
    return model.eval()
