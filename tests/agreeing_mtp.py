"""A tiny Qwen3.5 artifact whose MTP head always agrees with the model (the speculative tests' all-accepted path).

Built from the tiny random checkpoint: every block's output projection zeroed (each layer adds nothing to the
residual, so the model's next token is a function of its current token alone: lm_head of its normed embedding), and
an MTP head whose fc passes the normed embedding of its input token through (the hidden half zero, the MTP layer
adding nothing), so the head predicts from token t + 1 exactly what the model will predict there. Random tiny
weights otherwise accept almost no draft. A test-only checkpoint: nothing in the engine knows about it."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from ninfer.artifact.convert import convert
from safetensors.torch import load_file, save_file


def _agreeing(name: str, value: torch.Tensor, gdn_scale: float) -> torch.Tensor:
    if name.endswith("linear_attn.out_proj.weight"):
        return value * gdn_scale  # the Gated DeltaNet layers' share: 0 = none
    if name.endswith(("o_proj.weight", "out_proj.weight")) or "down_proj" in name:
        return torch.zeros_like(value)  # the block adds nothing to the residual stream
    if name in ("model.language_model.norm.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight"):
        return torch.zeros_like(value)  # zero-centred norms: plain normalisation, the same on both sides
    if name == "mtp.fc.weight":  # [H, 2H] over [normed embedding | normed hidden]
        h = value.shape[0]
        return torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1).to(value.dtype)
    return value


def agreeing_artifact(folder: Path, tiny_qwen35: Path, gdn_scale: float = 0.0) -> Path:
    """The artifact (bf16) under `folder`, built once from the tiny Qwen3.5 checkpoint folder. `gdn_scale` > 0 keeps
    that share of the Gated DeltaNet layers' output: the model's next token then also depends on its recurrent
    state, which the head does not see, so some drafts are rejected and the state rollback shows in the output."""
    name = f"{tiny_qwen35.name}.agreeing-mtp" + (f"-gdn{gdn_scale:g}" if gdn_scale else "")
    out = folder / f"{name}.bf16.ninfer"
    if out.exists():
        return out
    source = folder / name
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(tiny_qwen35, source)
    # Each shard rewritten under its own name with its own tensor names: the save_pretrained layout (and its index)
    # stays, only the values change.
    for part in source.glob("*.safetensors"):
        tensors = load_file(part)
        save_file({k: _agreeing(k, v, gdn_scale).contiguous() for k, v in tensors.items()}, part, metadata={"format": "pt"})
    convert(source, out, recipe="bf16", progress=False)
    return out
