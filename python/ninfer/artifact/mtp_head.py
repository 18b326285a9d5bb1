"""An MTP draft head from a file of its own, attached at conversion to a model that has none (`ninfer convert
--mtp-head FILE`; the embedded SmolLM2's trained head, python/ninfer/default_mtp/).

The file is safetensors with the head's tensors under their logical artifact names (docs/artifact-format.md): the
Qwen3.5 MTP structure (`mtp.fc` over [normed embedding | normed hidden], `mtp.pre_fc_norm_*`, `mtp.norm`) around one
decoder layer of the base model's own kind (`mtp.layers.0.*`: the same attention options, dense MLP), in the base
artifact's layout (for a GGUF `llama` model, Q/K rows in its interleaved RoPE pairing). The head shares the model's
embedding and lm-head, so it only fits the model it was trained for; the shapes are checked here and again at load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ninfer.artifact.convert import Source, SourceTensor
from ninfer.errors import ConversionError


def mtp_head_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor an attached head must have, with its shape, for a dense model of `config`."""
    h, d = config["hidden_size"], config["head_dim"]
    q, kv = config["num_heads"] * d, config["num_kv_heads"] * d
    q_rows = 2 * q if config["attn_output_gate"] else q
    inter = config["intermediate_size"]
    layer = "mtp.layers.0."
    shapes: dict[str, tuple[int, ...]] = {
        "mtp.fc": (h, 2 * h), "mtp.pre_fc_norm_embedding": (h,), "mtp.pre_fc_norm_hidden": (h,), "mtp.norm": (h,),
        layer + "input_norm": (h,), layer + "post_attn_norm": (h,),
        layer + "attn.q_proj": (q_rows, h), layer + "attn.k_proj": (kv, h), layer + "attn.v_proj": (kv, h),
        layer + "attn.o_proj": (h, q),
        layer + "mlp.gate": (inter, h), layer + "mlp.up": (inter, h), layer + "mlp.down": (h, inter),
    }
    if config["qkv_bias"]:
        shapes.update({layer + "attn.q_bias": (q_rows,), layer + "attn.k_bias": (kv,), layer + "attn.v_bias": (kv,)})
    if config["qk_norm"]:
        shapes.update({layer + "attn.q_norm": (d,), layer + "attn.k_norm": (d,)})
    return shapes


def attach_mtp_head(source: Source, head: Path) -> Source:
    """`source` with the head file's tensors added and `config.mtp` set; ConversionError when it does not fit."""
    from safetensors import SafetensorError, safe_open

    head = Path(head)
    if source.config.get("mtp"):
        raise ConversionError(f"{source.path}: the model has an MTP head already; --mtp-head adds one to a model "
                              "without")
    if source.config.get("moe") or source.config.get("linear_attention"):
        raise ConversionError(f"{head}: --mtp-head attaches a head to a dense full-attention model only "
                              f"({source.config['arch']} has its own MTP head in its checkpoint)")
    expected = mtp_head_shapes(source.config)
    try:
        handle = safe_open(str(head), framework="numpy")
    except (OSError, SafetensorError) as exc:
        raise ConversionError(f"{head}: not a readable safetensors file: {exc}") from exc
    names = set(handle.keys())
    missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
    if missing or extra:
        raise ConversionError(f"{head}: not an MTP head for this model: " + "; ".join(
            part for part in (f"missing {', '.join(missing)}" if missing else "",
                              f"unexpected {', '.join(extra)}" if extra else "") if part))

    def loader(name: str):
        return lambda: np.asarray(handle.get_tensor(name), dtype=np.float32)

    tensors = []
    for name, shape in expected.items():
        stored = tuple(handle.get_slice(name).get_shape())
        if stored != shape:
            raise ConversionError(f"{head}: {name} is {list(stored)}, this model needs {list(shape)}")
        tensors.append(SourceTensor(name, shape, loader(name)))
    source.tensors = [*source.tensors, *tensors]
    source.config = {**source.config, "mtp": {"num_layers": 1}}
    return source
