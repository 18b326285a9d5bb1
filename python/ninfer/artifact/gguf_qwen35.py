"""llama.cpp's `qwen35` / `qwen35moe` GGUF files -> the Qwen3.5 artifact layout (shared/reference/gguf-qwen35.md).

A file written by llama.cpp's `convert_hf_to_gguf.py` is not the HF tensors renamed; its converter changes values,
and this module undoes each change so the artifact equals the one converted from the HF checkpoint:
- every `*norm.weight` but the Gated DeltaNet `ssm_norm` holds `1 + w` (the zero-centred gain pre-folded): `- 1`;
- `ssm_a` holds `-exp(A_log)`: `log(-a)`;
- the value-head axis of the Gated DeltaNet tensors is in llama.cpp's tiled order (head v of key group k at
  v * n_k + k) instead of HF's grouped order (k * v_per_k + v): the V rows of `attn_qkv` and `ssm_conv1d`, the rows
  of `attn_gate`, `ssm_beta`, `ssm_alpha`, `ssm_a`, `ssm_dt.bias` and the columns of `ssm_out` are put back;
- the MTP block is `blk.{n_layers}` with `nextn.*` norms and projection;
- `ffn_gate_inp_shexp` is a vector [H] where HF has [1, H].
Quantised blocks that only move (row permutations, column permutations by whole groups) stay exact; a column
permutation that splits a group falls back to re-encoding, with its error printed (see convert.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ninfer.artifact.convert import QWEN35_EOS, QWEN35_PAD, Source, SourceTensor, decoder_config
from ninfer.artifact.format import QWEN35_FAMILY
from ninfer.artifact.gguf_blocks import NativeTensor
from ninfer.artifact.gguf_file import ATTENTION_NAMES, TOP_NAMES
from ninfer.errors import ConversionError

# GGUF architecture -> the artifact's.
QWEN35_GGUF_ARCHS = dict(zip(("qwen35", "qwen35moe"), QWEN35_FAMILY, strict=True))  # dense, MoE

_LAYER_NAMES = {
    **ATTENTION_NAMES,
    "post_attention_norm.weight": "post_attn_norm",
    "attn_q_norm.weight": "attn.q_norm",
    "attn_k_norm.weight": "attn.k_norm",
    "attn_qkv.weight": "gdn.in_qkv",
    "attn_gate.weight": "gdn.in_z",
    "ssm_conv1d.weight": "gdn.conv",
    "ssm_dt.bias": "gdn.dt_bias",
    "ssm_a": "gdn.A_log",
    "ssm_beta.weight": "gdn.in_b",
    "ssm_alpha.weight": "gdn.in_a",
    "ssm_norm.weight": "gdn.norm",
    "ssm_out.weight": "gdn.out_proj",
    "ffn_gate.weight": "mlp.gate",
    "ffn_up.weight": "mlp.up",
    "ffn_down.weight": "mlp.down",
    "ffn_gate_inp.weight": "moe.router",
    "ffn_gate_exps.weight": "moe.experts_gate",
    "ffn_up_exps.weight": "moe.experts_up",
    "ffn_down_exps.weight": "moe.experts_down",
    "ffn_gate_inp_shexp.weight": "moe.shared_expert_gate",
    "ffn_gate_shexp.weight": "moe.shared_gate",
    "ffn_up_shexp.weight": "moe.shared_up",
    "ffn_down_shexp.weight": "moe.shared_down",
}
_FUSED_EXPERTS = "ffn_gate_up_exps.weight"  # [E, 2F, H]: gate rows first, as HF's gate_up_proj
# The MTP block's own tensors (blk.{n_layers}.nextn.*) -> logical names.
_MTP_NAMES = {
    "nextn.eh_proj.weight": "mtp.fc",
    "nextn.enorm.weight": "mtp.pre_fc_norm_embedding",
    "nextn.hnorm.weight": "mtp.pre_fc_norm_hidden",
    "nextn.shared_head_norm.weight": "mtp.norm",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")
# Norms stored as 1 + w (everything ending in norm.weight, except ssm_norm which is stored as is).
_FOLDED_NORM = re.compile(r"(.*norm)\.weight")


@dataclass(frozen=True)
class HeadOrder:
    """llama.cpp's tiled value-head order -> HF's grouped one, along one axis in units of `unit` elements."""

    num_k_heads: int
    v_per_k: int

    def untile(self, values: np.ndarray, axis: int, unit: int) -> np.ndarray:
        shape = values.shape
        axis %= len(shape)
        if shape[axis] != self.num_k_heads * self.v_per_k * unit:
            raise ConversionError(f"GGUF value-head axis of length {shape[axis]} is not "
                                  f"{self.num_k_heads} x {self.v_per_k} heads x {unit}")
        tiled = values.reshape(shape[:axis] + (self.v_per_k, self.num_k_heads, unit) + shape[axis + 1:])
        return np.ascontiguousarray(np.swapaxes(tiled, axis, axis + 1)).reshape(shape)


@dataclass(frozen=True)
class Transform:
    """How one file tensor becomes its logical tensor: `values` on floats; `blobs(native)` the same change on a
    native tensor's blobs, or None where it cannot follow them (a group split): then the values are re-encoded."""

    values: Callable[[np.ndarray], np.ndarray]
    blobs: Callable[[NativeTensor], Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None]


def _rows(order: HeadOrder, unit: int, start: int = 0) -> Transform:
    """Untile the rows from `start` on (a 2-D tensor's axis 0, and every blob's: they all have a row axis)."""

    def move(values: np.ndarray) -> np.ndarray:
        if not start:
            return order.untile(values, 0, unit)
        return np.concatenate([values[:start], order.untile(values[start:], 0, unit)])

    return Transform(move, lambda native: lambda blobs: {name: move(blob) for name, blob in blobs.items()})


def _columns(order: HeadOrder, unit: int) -> Transform:
    """Untile the columns; blobs follow when a unit is whole groups (and so whole bytes of packed 4-bit codes)."""

    def blobs(native: NativeTensor) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None:
        group = native.group_size
        if unit % group:
            return None
        q_unit = unit if native.encoding == "int8" else unit // 2
        return lambda blobs: {name: order.untile(blob, -1, q_unit if name == "q" else unit // group)
                              for name, blob in blobs.items()}

    return Transform(lambda values: order.untile(values, -1, unit), blobs)


def _values_only(fn: Callable[[np.ndarray], np.ndarray]) -> Transform:
    return Transform(fn, lambda native: None)


def _transform(kind: str, order: HeadOrder | None, la: dict) -> Transform | None:
    """The change to undo for a tensor of GGUF kind `kind` (the name after `blk.N.`), None for a plain copy."""
    v_rows = order is not None and order.v_per_k > 1  # llama.cpp reorders only when n_v != n_k
    if kind == "ssm_a":
        untile = (lambda a: order.untile(a, 0, 1)) if v_rows else (lambda a: a)
        return _values_only(lambda a: np.log(-untile(a)).astype(np.float32))
    if _FOLDED_NORM.fullmatch(kind) and kind != "ssm_norm.weight":
        return _values_only(lambda w: (w - np.float32(1)).astype(np.float32))
    if not v_rows:
        return None
    kd, dv = la["num_key_heads"] * la["key_head_dim"], la["value_head_dim"]
    if kind in ("attn_qkv.weight", "ssm_conv1d.weight"):
        return _rows(order, dv, start=2 * kd)
    if kind == "attn_gate.weight":
        return _rows(order, dv)
    if kind in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_dt.bias"):
        return _rows(order, 1)
    if kind == "ssm_out.weight":
        return _columns(order, dv)
    return None


def _apply(tensor: SourceTensor, name: str, transform: Transform | None, shape: tuple[int, ...]) -> SourceTensor:
    if transform is None:
        return SourceTensor(name, shape, lambda: tensor.load().reshape(shape), tensor.native)
    native = tensor.native
    if native is not None and native.blobs is not None:
        move, raw = transform.blobs(native), native.blobs
        native = NativeTensor(native.encoding, (lambda: move(raw())) if move is not None else None, native.exact)
    return SourceTensor(name, shape, lambda: np.ascontiguousarray(transform.values(tensor.load())).reshape(shape),
                        native)


def map_tensors(tensors: list[tuple[str, SourceTensor]], config: dict, num_layers: int,
                path: Path) -> list[SourceTensor]:
    """The logical tensors of the file's (GGUF name, tensor read as is) pairs."""
    la = config["linear_attention"]
    order = HeadOrder(la["num_key_heads"], la["num_value_heads"] // la["num_key_heads"])
    out, unknown = [], []
    for gguf_name, tensor in tensors:
        mapped = _map_one(gguf_name, tensor, order, la, num_layers, config["hidden_size"])
        if mapped is None:
            unknown.append(gguf_name)
        else:
            out.extend(mapped)
    if unknown:
        raise ConversionError(f"{path}: GGUF tensors this converter does not know: {', '.join(unknown[:5])}")
    return out


def _map_one(gguf_name: str, tensor: SourceTensor, order: HeadOrder, la: dict, num_layers: int,
             hidden: int) -> list[SourceTensor] | None:
    if gguf_name in TOP_NAMES:
        kind, name = gguf_name, TOP_NAMES[gguf_name]
        return [_apply(tensor, name, _transform(kind, None, la), tensor.shape)]
    match = _BLOCK.fullmatch(gguf_name)
    if not match:
        return None
    layer, kind = int(match.group(1)), match.group(2)
    prefix = f"layers.{layer}." if layer < num_layers else f"mtp.layers.{layer - num_layers}."
    if layer >= num_layers and kind in _MTP_NAMES:
        return [_apply(tensor, _MTP_NAMES[kind], _transform(kind, None, la), tensor.shape)]
    if kind == _FUSED_EXPERTS:
        return _split_fused_experts(tensor, prefix)
    if kind not in _LAYER_NAMES:
        return None
    shape = (1, hidden) if kind == "ffn_gate_inp_shexp.weight" else tensor.shape
    return [_apply(tensor, prefix + _LAYER_NAMES[kind], _transform(kind, order, la), shape)]


def _split_fused_experts(tensor: SourceTensor, prefix: str) -> list[SourceTensor]:
    experts, rows, cols = tensor.shape
    half = rows // 2
    native = NativeTensor(tensor.native.encoding, None) if tensor.native is not None else None

    def part(lo: int) -> Callable[[], np.ndarray]:
        return lambda: np.ascontiguousarray(tensor.load()[:, lo:lo + half])

    return [SourceTensor(f"{prefix}moe.experts_gate", (experts, half, cols), part(0), native),
            SourceTensor(f"{prefix}moe.experts_up", (experts, half, cols), part(half), native)]


def qwen35_config(arch: str, meta: Callable[[str, object], object], required: Callable[[str], object],
                  vocab_size: int, tie: bool) -> tuple[dict, int]:
    """The normalised config from the file's `{arch}.*` metadata, and the number of decoder layers (the file's
    block_count less its MTP blocks)."""
    blocks = int(required(f"{arch}.block_count"))
    mtp_layers = int(meta(f"{arch}.nextn_predict_layers", 0))
    num_layers = blocks - mtp_layers
    if num_layers < 1:
        raise ConversionError(f"GGUF block_count {blocks} leaves no decoder layer after {mtp_layers} MTP layers")
    recurrent = meta(f"{arch}.attention.recurrent_layers", None)
    if recurrent is not None:
        layer_types = ["linear_attention" if r else "full_attention" for r in list(recurrent)[:num_layers]]
    else:
        interval = int(meta(f"{arch}.full_attention_interval", 4))
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    heads = int(required(f"{arch}.attention.head_count"))
    head_dim = int(required(f"{arch}.attention.key_length"))
    value_heads = int(required(f"{arch}.ssm.time_step_rank"))
    sections = [int(s) for s in meta(f"{arch}.rope.dimension_sections", [])]
    while sections and sections[-1] == 0:
        sections.pop()
    moe = None
    if arch == "qwen35moe":
        moe = {"num_experts": int(required(f"{arch}.expert_count")),
               "top_k": int(required(f"{arch}.expert_used_count")),
               "intermediate_size": int(required(f"{arch}.expert_feed_forward_length")),
               "shared_intermediate_size": int(required(f"{arch}.expert_shared_feed_forward_length"))}
    config = decoder_config(
        arch=QWEN35_GGUF_ARCHS[arch],
        vocab_size=vocab_size,
        hidden_size=int(required(f"{arch}.embedding_length")),
        num_layers=num_layers,
        layer_types=layer_types,
        num_heads=heads,
        num_kv_heads=int(meta(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        intermediate_size=None if moe else int(required(f"{arch}.feed_forward_length")),
        rms_norm_eps=float(required(f"{arch}.attention.layer_norm_rms_epsilon")),
        norm_offset=True,
        attn_output_gate=True,
        qk_norm=True,
        rope={"theta": float(meta(f"{arch}.rope.freq_base", 1e7)),
              "rotary_dim": int(meta(f"{arch}.rope.dimension_count", head_dim // 4)),
              "pairing": "half", "mrope_section": sections or None},
        tie_word_embeddings=tie,
        max_position_embeddings=int(meta(f"{arch}.context_length", 32768)),
        linear_attention={
            "num_key_heads": int(required(f"{arch}.ssm.group_count")),
            "num_value_heads": value_heads,
            "key_head_dim": int(required(f"{arch}.ssm.state_size")),
            "value_head_dim": int(required(f"{arch}.ssm.inner_size")) // value_heads,
            "conv_kernel": int(meta(f"{arch}.ssm.conv_kernel", 4)),
        },
        moe=moe,
        mtp={"num_layers": mtp_layers} if mtp_layers else None,
    )
    return config, num_layers


def qwen35_source(path: Path, arch: str, config: dict, tensors: list[SourceTensor], eos: int | None,
                  pad: int | None, tokenizer_json: str, chat_template: str | None,
                  generation_defaults: dict) -> Source:
    # As for HF sources: the family's tokenizer adds no BOS and a turn ends at <|im_end|> or <|endoftext|>.
    eos_ids = list(QWEN35_EOS) + ([int(eos)] if eos is not None and int(eos) not in QWEN35_EOS else [])
    pad_id = QWEN35_PAD if pad is None else int(pad)
    config.update(bos_token_id=None, eos_token_ids=eos_ids)
    return Source(kind="gguf", path=path.resolve(), architecture=arch, config=config, tensors=tensors,
                  tokenizer_json=tokenizer_json, chat_template=chat_template, generation_defaults=generation_defaults,
                  special_tokens={"bos": None, "eos": eos_ids, "pad": pad_id})
