"""An MTP head attached to a plain Llama model (`convert(..., mtp_head=FILE)`, ninfer.artifact.mtp_head): the head's
forward pass against HF's own Llama decoder layer on the same weights, speculative decoding with it lossless against
plain decoding, and the converter's refusals of a head that does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_helpers import run_together
from ninfer import _testing
from ninfer.artifact.convert import convert
from ninfer.artifact.mtp_head import mtp_head_shapes
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from ninfer.errors import ConversionError
from safetensors.numpy import save_file
from tiny_models import PLAIN_VOCAB

HEAD_SEED = 7


def _llama_config(tiny_llama: Path) -> dict:
    return json.loads((tiny_llama / "config.json").read_text())


def _artifact_config(tiny_llama: Path) -> dict:
    """The normalised config the converter gives the tiny Llama (the head's shapes follow it)."""
    c = _llama_config(tiny_llama)
    return {"hidden_size": c["hidden_size"], "head_dim": c["hidden_size"] // c["num_attention_heads"],
            "num_heads": c["num_attention_heads"], "num_kv_heads": c["num_key_value_heads"],
            "intermediate_size": c["intermediate_size"], "attn_output_gate": False, "qkv_bias": False,
            "qk_norm": False}


def _random_head(tiny_llama: Path, folder: Path, seed: int) -> Path:
    """A head file of random weights (norms near 1) for the tiny Llama, bf16-exact values. Written directly: the
    file is ninfer's own format (logical names, ninfer.artifact.mtp_head), which nothing in transformers writes."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in mtp_head_shapes(_artifact_config(tiny_llama)).items():
        value = 1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else 0.08 * rng.standard_normal(shape)
        # bf16-representable, so the bf16 artifact holds these values exactly and the reference reads the same
        out[name] = torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).float().numpy()
    path = folder / f"tiny-llama-head-seed{seed}.safetensors"
    save_file(out, str(path))
    return path


@pytest.fixture(scope="module")
def head_file(tmp_path_factory, tiny_llama) -> Path:
    return _random_head(tiny_llama, tmp_path_factory.mktemp("head"), HEAD_SEED)


@pytest.fixture(scope="module")
def headed_artifact(tmp_path_factory, tiny_llama, head_file) -> Path:
    out = tmp_path_factory.mktemp("headed") / "tiny-llama+mtp.bf16.ninfer"
    return convert(tiny_llama, out, recipe="bf16", progress=False, mtp_head=head_file)


def _reference_mtp_logits(tiny_llama: Path, head_file: Path, hidden: np.ndarray, next_tokens: np.ndarray):
    """HF's LlamaDecoderLayer (eager attention, causal) between the head's fc and norm, the checkpoint's embedding
    and lm-head around it, in f32."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(**{k: v for k, v in _llama_config(tiny_llama).items() if k != "architectures"})
    config._attn_implementation = "eager"
    base = load_file(str(tiny_llama / "model.safetensors"))
    head = load_file(str(head_file))
    layer = LlamaDecoderLayer(config, layer_idx=0).float().eval()
    prefix = "mtp.layers.0."
    layer.load_state_dict({
        "input_layernorm.weight": head[prefix + "input_norm"],
        "post_attention_layernorm.weight": head[prefix + "post_attn_norm"],
        **{f"self_attn.{p}_proj.weight": head[f"{prefix}attn.{p}_proj"] for p in "qkvo"},
        **{f"mlp.{p}_proj.weight": head[f"{prefix}mlp.{p}"] for p in ("gate", "up", "down")},
    })

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps) * w

    embed = base["model.embed_tokens.weight"].float()
    e = rms(embed[torch.from_numpy(next_tokens).long()], head["mtp.pre_fc_norm_embedding"])
    h = rms(torch.from_numpy(hidden), head["mtp.pre_fc_norm_hidden"])
    u = (torch.cat([e, h], -1) @ head["mtp.fc"].T)[None]
    n = u.shape[1]
    positions = torch.arange(n)[None]
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out = layer(u, attention_mask=mask, position_ids=positions,
                    position_embeddings=LlamaRotaryEmbedding(config)(u, positions))
        out = out[0] if isinstance(out, tuple) else out
        return (rms(out[0], head["mtp.norm"]) @ base["lm_head.weight"].float().T).numpy()


def test_the_attached_head_runs_as_hf_llama_layer_between_fc_and_norm(tiny_llama, head_file, headed_artifact):
    model = _testing.Model.open(str(headed_artifact), max_context=256, kv_dtype="f32")
    assert model.has_mtp and model.config["mtp"] == {"num_layers": 1}
    tokens = np.random.default_rng().integers(0, PLAIN_VOCAB, size=40).astype(np.int32)
    seq = model.new_sequence()
    model.prefill(seq, tokens, all_logits=True)
    hidden = np.asarray(model.hidden)  # final-normed rows, the head's input
    got = model.mtp_logits(seq, np.ascontiguousarray(hidden[:-1]), np.ascontiguousarray(tokens[1:]), 0)
    want = _reference_mtp_logits(tiny_llama, head_file, hidden[:-1], tokens[1:])
    assert got.shape == want.shape == (39, PLAIN_VOCAB)
    scale = float(np.abs(want).max())
    assert float(np.abs(got - want).max()) < 2e-4 * max(scale, 1.0), (np.abs(got - want).max(), scale)


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_decoding_with_an_attached_head_matches_plain_decoding(headed_artifact, k):
    rng = np.random.default_rng()
    requests = [Request(rng.integers(0, PLAIN_VOCAB, size=n).tolist(), SamplingParams(temperature=0),
                        max_new_tokens=24, stop_token_ids=()) for n in (64, 37)]

    def generate(spec: dict):
        options = EngineOptions(backend="cpu", max_context=256, max_concurrency=2, threads=2, **spec)
        with Engine.open_sync(headed_artifact, options) as engine:
            return run_together(engine, requests)

    plain = generate({})
    spec = generate({"spec": "mtp", "draft_tokens": k})
    for (tokens_a, _), (tokens_b, last_b) in zip(plain, spec, strict=True):
        assert tokens_b == tokens_a
        assert last_b.timings.draft_n > 0


def test_a_head_that_does_not_fit_is_refused_with_the_reason(tmp_path, tiny_llama, head_file, headed_artifact):
    from safetensors.numpy import load_file

    head = load_file(str(head_file))
    without = dict(head)
    without.pop("mtp.layers.0.mlp.up")
    save_file(without, str(tmp_path / "missing.safetensors"))
    with pytest.raises(ConversionError, match=r"missing mtp\.layers\.0\.mlp\.up"):
        convert(tiny_llama, tmp_path / "a.ninfer", mtp_head=tmp_path / "missing.safetensors", progress=False)
    wrong = dict(head, **{"mtp.fc": np.zeros((3, 4), np.float32)})
    save_file(wrong, str(tmp_path / "wrong.safetensors"))
    with pytest.raises(ConversionError, match=r"mtp\.fc is \[3, 4\], this model needs \[64, 128\]"):
        convert(tiny_llama, tmp_path / "b.ninfer", mtp_head=tmp_path / "wrong.safetensors", progress=False)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ConversionError, match="not a readable safetensors file"):
        convert(tiny_llama, tmp_path / "c.ninfer", mtp_head=tmp_path / "junk.safetensors", progress=False)
    assert not any(tmp_path.glob("*.ninfer"))


def test_a_model_with_its_own_head_takes_no_second(tmp_path, tiny_qwen3_5, head_file):
    with pytest.raises(ConversionError, match="has an MTP head already"):
        convert(tiny_qwen3_5, tmp_path / "q.ninfer", mtp_head=head_file, progress=False)
