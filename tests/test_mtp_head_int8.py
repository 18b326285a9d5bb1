"""The int8 layout of an MTP head file (ninfer.artifact.mtp_head: 2-D tensors as I8 codes with per-row F16
`NAME.scale`, 1-D tensors F16; the shipped SmolLM2 head, bench/mtp_head/quantize_int8.py): written from a random f16
head, read back by the converter's loader within the rounding bound, and a malformed file refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ninfer.artifact.convert import Source
from ninfer.artifact.mtp_head import SCALE_SUFFIX, attach_mtp_head, int8_head_tensors, mtp_head_shapes
from ninfer.errors import ConversionError
from safetensors.numpy import save_file

# A dense model's normalised config, small (the loader only reads the head's shapes from it).
CONFIG = {"arch": "llama", "hidden_size": 64, "head_dim": 16, "num_heads": 4, "num_kv_heads": 2,
          "intermediate_size": 96, "attn_output_gate": False, "qkv_bias": True, "qk_norm": False}


def _random_f16_head(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Norms near 1, biases and weights of mixed scales: rows of very different magnitudes, one row of zeros, one
    with a single large value, so the per-row scale is what keeps the small rows exact enough."""
    out = {}
    for name, shape in mtp_head_shapes(CONFIG).items():
        if len(shape) == 1:
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) * np.exp(rng.uniform(-6, 1, size=(shape[0], 1)))
            value[rng.integers(shape[0])] = 0.0
            value[rng.integers(shape[0]), rng.integers(shape[1])] = 40.0
        out[name] = value.astype(np.float16)
    return out


def _attached(path: Path) -> dict[str, np.ndarray]:
    """What the converter reads from the head file: every attached tensor, loaded."""
    source = Source(kind="hf", path=Path("model"), architecture="LlamaForCausalLM", config=dict(CONFIG), tensors=[])
    attached = attach_mtp_head(source, path)
    assert attached.config["mtp"] == {"num_layers": 1}
    return {t.name: t.load() for t in attached.tensors}


def test_the_int8_layout_loads_within_half_a_step_of_each_f16_value(tmp_path):
    seed = int(np.random.SeedSequence().entropy % 2**32)
    source = _random_f16_head(np.random.default_rng(seed))
    stored = int8_head_tensors(source)
    save_file(stored, str(tmp_path / "int8.safetensors"))
    save_file(source, str(tmp_path / "f16.safetensors"))
    loaded = _attached(tmp_path / "int8.safetensors")
    assert set(loaded) == set(source)
    for name, want in source.items():
        got, want = loaded[name], want.astype(np.float32)
        assert got.dtype == np.float32 and got.shape == want.shape
        if want.ndim == 1:
            assert stored[name].dtype == np.float16 and np.array_equal(got, want), (name, seed)
            continue
        codes, scale = stored[name], stored[name + SCALE_SUFFIX].astype(np.float64)
        assert codes.dtype == np.int8 and stored[name + SCALE_SUFFIX].dtype == np.float16
        peak = np.abs(want).max(axis=1, keepdims=True).astype(np.float64)
        # symmetric: -128 is never used, and the f16 scale is max|row| / 127 rounded up, never down
        assert np.abs(codes.astype(np.int32)).max() <= 127 and (scale >= peak[:, 0] / 127).all(), (name, seed)
        # max|row| / 254 per element, widened only by the f16 scale's rounding up (at most 2^-10 relative)
        bound = peak / 254 * (1 + 2.0**-10)
        error = np.abs(got.astype(np.float64) - want)
        assert (error <= bound).all(), (name, seed, float((error / np.maximum(bound, 1e-30)).max()))
        # and the scale is the row's own, not a coarser one: a step of max|row| / 127 leaves errors near the bound
        assert float((error / np.maximum(bound, 1e-30)).max()) > 0.5, (name, seed)
        assert not got[peak[:, 0] == 0].any()  # a zero row stays zero
    # the f16 layout still loads, exactly; the int8 file is about half its size
    from_f16 = _attached(tmp_path / "f16.safetensors")
    assert all(np.array_equal(v, source[k].astype(np.float32)) for k, v in from_f16.items())
    assert (tmp_path / "int8.safetensors").stat().st_size < 0.55 * (tmp_path / "f16.safetensors").stat().st_size


def _malformed(case: str, head: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    fc, norm = "mtp.fc", "mtp.norm"
    if case == "missing scale":
        head.pop(fc + SCALE_SUFFIX)
    elif case == "integer weight":
        head[fc] = head[fc].astype(np.int32)
        head.pop(fc + SCALE_SUFFIX)
    elif case == "f32 scale":
        head[fc + SCALE_SUFFIX] = head[fc + SCALE_SUFFIX].astype(np.float32)
    elif case == "scale per column":
        head[fc + SCALE_SUFFIX] = np.ones(head[fc].shape[1], np.float16)
    elif case == "int8 norm":
        head[norm], head[norm + SCALE_SUFFIX] = np.ones(head[norm].shape, np.int8), np.ones(1, np.float16)
    elif case == "scale of a float tensor":
        head[norm + SCALE_SUFFIX] = np.ones(1, np.float16)
    elif case == "stray scale":
        head["mtp.other" + SCALE_SUFFIX] = np.ones(1, np.float16)
    return head


MALFORMED = {
    "missing scale": r"mtp\.fc is I8 but mtp\.fc\.scale \(its per-row F16 scales\) is missing",
    "integer weight": r"mtp\.fc is I32; a head tensor is F16, F32, F64, or I8 with per-row F16 scales in "
                      r"mtp\.fc\.scale",
    "f32 scale": r"mtp\.fc\.scale is F32 \[64\], expected F16 \[64\] \(one scale per row of mtp\.fc\)",
    "scale per column": r"mtp\.fc\.scale is F16 \[128\], expected F16 \[64\]",
    "int8 norm": r"mtp\.norm is I8 but 1-D; only 2-D tensors are stored int8",
    "scale of a float tensor": r"mtp\.norm is F16 but has a mtp\.norm\.scale; only an I8 tensor has scales",
    "stray scale": r"not an MTP head for this model: unexpected mtp\.other\.scale",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_int8_file_is_refused_in_one_line(tmp_path, case):
    head = _malformed(case, int8_head_tensors(_random_f16_head(np.random.default_rng())))
    save_file(head, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ConversionError, match=MALFORMED[case]) as info:
        _attached(tmp_path / "bad.safetensors")
    assert "\n" not in str(info.value) and str(info.value).startswith(str(tmp_path / "bad.safetensors"))


def test_a_bf16_tensor_is_refused_by_name_not_with_numpy_s_error(tmp_path):
    """numpy has no bfloat16: the loader says which dtypes it reads instead of failing inside safetensors."""
    from safetensors.torch import save_file as save_torch

    head = {k: torch.from_numpy(v.astype(np.float32)) for k, v in _random_f16_head(np.random.default_rng()).items()}
    head["mtp.fc"] = head["mtp.fc"].to(torch.bfloat16)
    save_torch(head, str(tmp_path / "bf16.safetensors"))
    with pytest.raises(ConversionError, match=r"mtp\.fc is BF16; a head tensor is F16, F32, F64, or I8"):
        _attached(tmp_path / "bf16.safetensors")


def test_ninfer_convert_prints_the_refusal_as_one_line(tmp_path, tiny_llama, capsys):
    from ninfer.artifact.convert import open_source
    from ninfer.cli.main import main

    shapes = mtp_head_shapes(open_source(tiny_llama).config)
    head = _malformed("missing scale", int8_head_tensors({n: np.ones(s, np.float16) for n, s in shapes.items()}))
    save_file(head, str(tmp_path / "bad.safetensors"))
    argv = ["convert", str(tiny_llama), str(tmp_path / "x.ninfer"), "--mtp-head", str(tmp_path / "bad.safetensors"),
            "--no-progress"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("ninfer: error: ") and "mtp.fc is I8 but mtp.fc.scale" in line
    assert not (tmp_path / "x.ninfer").exists()
