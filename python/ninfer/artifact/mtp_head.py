"""An MTP draft head from a file of its own, attached at conversion to a model that has none (`ninfer convert
--mtp-head FILE`; the embedded SmolLM2's trained head, python/ninfer/default_mtp/).

The file is safetensors with the head's tensors under their logical artifact names (docs/artifact-format.md): the
Qwen3.5 MTP structure (`mtp.fc` over [normed embedding | normed hidden], `mtp.pre_fc_norm_*`, `mtp.norm`) around one
decoder layer of the base model's own kind (`mtp.layers.0.*`: the same attention options, dense MLP), in the base
artifact's layout (for a GGUF `llama` model, Q/K rows in its interleaved RoPE pairing). The head shares the model's
embedding and lm-head, so it only fits the model it was trained for; the shapes are checked here and again at load.

Each tensor is stored in one of two layouts, told apart by its dtype (docs/conversion.md):
- float (F16, F32 or F64): the values themselves, as `bench/mtp_head/train.py` writes them;
- int8 (a 2-D tensor only): `NAME` holds I8 codes and `NAME.scale` the F16 scale of each row, symmetric, the value
  being `code * scale`. `int8_head_tensors` writes it (the shipped SmolLM2 head, converted from the trained f16 file
  by bench/mtp_head/quantize_int8.py, is half the size); the loader dequantises it to float32.
Either way the converter then encodes the head as its recipe says, like the model's own tensors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ninfer.artifact.convert import Source, SourceTensor
from ninfer.errors import ConversionError

SCALE_SUFFIX = ".scale"  # `NAME.scale`: the per-row F16 scales of the I8 tensor NAME
FLOAT_DTYPES = ("F16", "F32", "F64")  # the float dtypes numpy reads (not BF16)
INT8_CODE_MAX = 127  # symmetric: codes in -127..127, so the scale is max|row| / 127


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


def quantize_rows_int8(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8 of a 2-D `weight`: (I8 codes, F16 scales), `weight ~ codes * scale[:, None]`.

    The scale is max|row| / 127 rounded *up* to f16, so no code clips and every element is within scale / 2 of its
    value (max|row| / 254, up to f16's rounding of the scale); a row of zeros gets scale 0 and codes 0."""
    w = np.asarray(weight, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"per-row int8 needs a 2-D tensor, got shape {list(w.shape)}")
    exact = np.abs(w).max(axis=1) / INT8_CODE_MAX
    scale = exact.astype(np.float16)
    if not np.isfinite(scale).all():
        raise ValueError("a row's max|value| / 127 does not fit f16")
    low = scale.astype(np.float64) < exact
    scale[low] = np.nextafter(scale[low], np.float16(np.inf))
    s = scale.astype(np.float64)[:, None]
    codes = np.rint(np.divide(w, s, out=np.zeros_like(w), where=s > 0))
    assert np.abs(codes).max(initial=0) <= INT8_CODE_MAX  # the scale was rounded up
    return codes.astype(np.int8), scale


def int8_head_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The int8 layout of a head's tensors: each 2-D tensor as I8 codes plus `NAME.scale`, the rest (norms,
    biases) as F16."""
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if value.ndim == 2:
            out[name], out[name + SCALE_SUFFIX] = quantize_rows_int8(value)
        else:
            out[name] = np.asarray(value, dtype=np.float16)
    return out


def _head_tensor(handle, head: Path, name: str, shape: tuple[int, ...], names: set[str]) -> SourceTensor:
    """The SourceTensor of `name` in either layout, its dtype, shape and scale checked (one-line errors)."""
    part = handle.get_slice(name)
    stored, dtype = tuple(part.get_shape()), part.get_dtype()
    if stored != shape:
        raise ConversionError(f"{head}: {name} is {list(stored)}, this model needs {list(shape)}")
    scale_name = name + SCALE_SUFFIX
    if dtype in FLOAT_DTYPES:
        if scale_name in names:
            raise ConversionError(f"{head}: {name} is {dtype} but has a {scale_name}; only an I8 tensor has scales")
        return SourceTensor(name, shape, lambda: np.asarray(handle.get_tensor(name), dtype=np.float32))
    if dtype != "I8":
        raise ConversionError(f"{head}: {name} is {dtype}; a head tensor is {', '.join(FLOAT_DTYPES)}, or I8 with "
                              f"per-row F16 scales in {scale_name}")
    if len(shape) != 2:
        raise ConversionError(f"{head}: {name} is I8 but {len(shape)}-D; only 2-D tensors are stored int8 (per row)")
    if scale_name not in names:
        raise ConversionError(f"{head}: {name} is I8 but {scale_name} (its per-row F16 scales) is missing")
    scale_part = handle.get_slice(scale_name)
    scale_shape, scale_dtype = tuple(scale_part.get_shape()), scale_part.get_dtype()
    if scale_dtype != "F16" or scale_shape != shape[:1]:
        raise ConversionError(f"{head}: {scale_name} is {scale_dtype} {list(scale_shape)}, expected F16 "
                              f"[{shape[0]}] (one scale per row of {name})")

    def dequantised() -> np.ndarray:
        scale = np.asarray(handle.get_tensor(scale_name), dtype=np.float32)
        return handle.get_tensor(name).astype(np.float32) * scale[:, None]  # exact: 8-bit x 11-bit products

    return SourceTensor(name, shape, dequantised)


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
    known = set(expected) | {name + SCALE_SUFFIX for name in expected}
    missing, extra = sorted(set(expected) - names), sorted(names - known)
    if missing or extra:
        raise ConversionError(f"{head}: not an MTP head for this model: " + "; ".join(
            part for part in (f"missing {', '.join(missing)}" if missing else "",
                              f"unexpected {', '.join(extra)}" if extra else "") if part))
    tensors = [_head_tensor(handle, head, name, shape, names) for name, shape in expected.items()]
    source.tensors = [*source.tensors, *tensors]
    source.config = {**source.config, "mtp": {"num_layers": 1}}
    return source
