"""GPTQ and AWQ int4 checkpoints convert without re-quantising when their groups line up: the artifact's int4 codes,
scales and zero points are the checkpoint's, and the engine's logits match HF transformers run on the checkpoint's
dequantised weights. Act-order GPTQ (desc_act, g_idx a permutation of the groups) is re-encoded, with the error
printed.

No producer runs here: auto-gptq 0.7.1 is a 23 MB wheel of CUDA extensions that needs peft, datasets, rouge and
gekko; GPTQModel 7.7 and AutoAWQ 0.2.9 are sdists that build CUDA kernels; transformers' own GPTQ and AWQ paths call
into them. So a save_pretrained llama is quantised here (round to nearest with GPTQ's and AWQ's own min/max grids) and
packed as the producers document it (hf_gptq.py names what was read), and the test checks the packed layout element
by element with an unpack written separately from the same documentation, in integer arithmetic."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from ninfer.artifact.convert import convert
from ninfer.artifact.encodings import decode, unpack_nibbles
from ninfer.artifact.reader import read_artifact
from ninfer.errors import ConversionError
from quantized_llama import CONFIG, assert_logits_match, convert_layers_as
from safetensors.torch import load_file, save_file

LINEARS = {"self_attn.q_proj": "attn.q_proj", "self_attn.k_proj": "attn.k_proj", "self_attn.v_proj": "attn.v_proj",
           "self_attn.o_proj": "attn.o_proj", "mlp.gate_proj": "mlp.gate", "mlp.up_proj": "mlp.up",
           "mlp.down_proj": "mlp.down"}
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's WQLinear_GEMM: nibble k of a word holds column 8w + AWQ_ORDER[k]
# name -> (method, group_size (-1: one group), symmetric, checkpoint format, desc_act)
SCHEMES = {
    "gptq-sym-g128": ("gptq", 128, True, "gptq", False),
    "gptq-asym-g32": ("gptq", 32, False, "gptq", False),
    "gptq-v2-asym-g64": ("gptq", 64, False, "gptq_v2", False),
    "gptq-asym-channel": ("gptq", -1, False, "gptq", False),
    "awq-g128": ("awq", 128, False, None, False),
    "awq-g64": ("awq", 64, False, None, False),
}


class Quantised:
    """One weight [out, in] on a 4-bit grid: codes [out, in], and per (output row, group) scale (f16 values) and
    unsigned zero point; `g_idx[i]` is input column i's group."""

    def __init__(self, weight: np.ndarray, group_size: int, symmetric: bool, rng: np.random.Generator | None):
        out, cols = weight.shape
        size = cols if group_size == -1 else group_size
        # act-order: the groups are taken over the columns in a random order (GPTQ's order of decreasing Hessian
        # diagonal), so g_idx is a permutation of the row-order groups.
        order = rng.permutation(cols) if rng is not None else np.arange(cols)
        self.g_idx = np.empty(cols, dtype=np.int32)
        self.g_idx[order] = np.arange(cols) // size
        groups = cols // size
        self.scale = np.empty((out, groups), dtype=np.float16)
        self.zero = np.empty((out, groups), dtype=np.uint8)
        self.codes = np.empty((out, cols), dtype=np.uint8)
        for g in range(groups):
            columns = np.flatnonzero(self.g_idx == g)
            block = weight[:, columns]
            if symmetric:  # GPTQ's symmetric grid: +-amax over 15 steps, zero point 8
                scale, zero = (2 * np.abs(block).max(axis=1) / 15).astype(np.float16), np.full(out, 8.0)
            else:  # min/max (the range always holding 0), zero point rounded
                low, high = np.minimum(block.min(axis=1), 0), np.maximum(block.max(axis=1), 0)
                scale = ((high - low) / 15).astype(np.float16)
                zero = np.clip(np.rint(-low / scale.astype(np.float32)), 0, 15)
            step = scale.astype(np.float32)[:, None]
            self.codes[:, columns] = np.clip(np.rint(block / step) + zero[:, None], 0, 15)
            self.scale[:, g], self.zero[:, g] = scale, zero

    def dequantized(self) -> np.ndarray:
        scale = self.scale.astype(np.float32)[:, self.g_idx]
        return (self.codes.astype(np.float32) - self.zero[:, self.g_idx]) * scale


def pack_along_rows(values: np.ndarray) -> np.ndarray:
    """[n, m] nibbles -> int32 [n / 8, m]: row 8r + j in bits 4j..4j+3 of word row r (GPTQ's qweight)."""
    words = np.zeros((values.shape[0] // 8, values.shape[1]), dtype=np.int64)
    for j in range(8):
        words += values[j::8].astype(np.int64) << (4 * j)
    return words.astype(np.uint32).view(np.int32)


def pack_along_columns(values: np.ndarray, order: list[int]) -> np.ndarray:
    """[n, m] nibbles -> int32 [n, m / 8]: nibble k of word w holds column 8w + order[k]."""
    words = np.zeros((values.shape[0], values.shape[1] // 8), dtype=np.int64)
    for k, column in enumerate(order):
        words += values[:, column::8].astype(np.int64) << (4 * k)
    return words.astype(np.uint32).view(np.int32)


def pack(quantised: Quantised, method: str, checkpoint_format: str | None) -> dict[str, torch.Tensor]:
    """The module's checkpoint tensors (qweight, qzeros, scales, g_idx) as the producer's documentation lays out."""
    scales = torch.from_numpy(np.ascontiguousarray(quantised.scale.T))
    if method == "awq":
        return {"qweight": torch.from_numpy(pack_along_columns(quantised.codes.T, AWQ_ORDER)),
                "qzeros": torch.from_numpy(pack_along_columns(quantised.zero.T, AWQ_ORDER)), "scales": scales}
    stored_zero = (quantised.zero.T.astype(np.int64) - (1 if checkpoint_format == "gptq" else 0)) & 0xF
    return {"qweight": torch.from_numpy(pack_along_rows(quantised.codes.T)),
            "qzeros": torch.from_numpy(pack_along_columns(stored_zero, list(range(8)))), "scales": scales,
            "g_idx": torch.from_numpy(quantised.g_idx)}


def nibble(words: np.ndarray, index: tuple[int, int], k: int) -> int:
    """Nibble k of one int32 word, by integer division (independent of any shift-and-mask unpacker)."""
    return (int(words[index]) % 2**32) // 16**k % 16


def write_checkpoint(folder: Path, scheme: tuple) -> dict[str, Quantised]:
    """A save_pretrained fp16 llama whose layer linears are replaced by their packed int4 form (`scheme` as in
    SCHEMES); returns each weight's Quantised."""
    import transformers

    method, group_size, symmetric, checkpoint_format, desc_act = scheme
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).half().save_pretrained(folder)
    state, rng, quantised = load_file(folder / "model.safetensors"), np.random.default_rng(1), {}
    for name in [n for n in state if n.endswith("_proj.weight")]:
        module = name[: -len(".weight")]
        quantised[name] = Quantised(state.pop(name).float().numpy(), group_size, symmetric, rng if desc_act else None)
        state.update({f"{module}.{part}": tensor for part, tensor in pack(quantised[name], method,
                                                                          checkpoint_format).items()})
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    if method == "awq":
        config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size,
                                         "zero_point": True, "version": "gemm"}
    else:
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group_size,
                                         "desc_act": desc_act, "sym": symmetric, "checkpoint_format": checkpoint_format}
    (folder / "config.json").write_text(json.dumps(config))
    return quantised


@pytest.fixture(scope="module", params=sorted(SCHEMES))
def packed(request, tmp_path_factory) -> tuple[str, Path, dict[str, Quantised], Path]:
    root = tmp_path_factory.mktemp(request.param)
    quantised = write_checkpoint(root / "ckpt", SCHEMES[request.param])
    return request.param, root / "ckpt", quantised, convert_layers_as("int4", root / "ckpt", root / "m.ninfer")


def test_the_packers_write_the_documented_layout(packed):
    scheme, folder, quantised, _ = packed
    method, _, _, checkpoint_format, _ = SCHEMES[scheme]
    state = load_file(folder / "model.safetensors")
    prefix = "model.layers.1.mlp.down_proj"
    q = quantised[prefix + ".weight"]
    qweight, qzeros = state[prefix + ".qweight"].numpy(), state[prefix + ".qzeros"].numpy()
    assert qweight.dtype == np.int32 and qzeros.dtype == np.int32
    rng = np.random.default_rng(5)
    for out, col in zip(rng.integers(0, 256, 64), rng.integers(0, 384, 64), strict=True):
        group = q.g_idx[col]
        if method == "awq":  # [in, out / 8], interleaved along the outputs
            assert qweight.shape == (384, 32)
            assert nibble(qweight, (col, out // 8), AWQ_ORDER.index(out % 8)) == q.codes[out, col]
            assert nibble(qzeros, (group, out // 8), AWQ_ORDER.index(out % 8)) == q.zero[out, group]
        else:  # [in / 8, out], in order along the inputs; v1 zero points stored minus one
            assert qweight.shape == (48, 256)
            assert nibble(qweight, (col // 8, out), col % 8) == q.codes[out, col]
            minus = 1 if checkpoint_format == "gptq" else 0
            assert nibble(qzeros, (group, out // 8), out % 8) == q.zero[out, group] - minus
        assert state[prefix + ".scales"][group, out].item() == float(q.scale[out, group])


def test_codes_scales_and_zero_points_are_the_checkpoints(packed):
    scheme, _, quantised, out = packed
    group_size = SCHEMES[scheme][1]
    with read_artifact(out) as artifact:
        for layer in range(CONFIG["num_hidden_layers"]):
            for linear, logical in LINEARS.items():
                q = quantised[f"model.layers.{layer}.{linear}.weight"]
                entry = artifact.tensor(f"layers.{layer}.{logical}")
                blobs = artifact.tensor_bytes(entry["name"])
                artifact_group = 128 if group_size == -1 else group_size
                assert entry["encoding"] == "int4" and entry["group_size"] == artifact_group
                first = q.g_idx[::artifact_group]  # each artifact group's producer group
                np.testing.assert_array_equal(unpack_nibbles(blobs["q"]), q.codes)
                np.testing.assert_array_equal(blobs["scale"], q.scale[:, first])
                np.testing.assert_array_equal(blobs["zero"], q.zero[:, first])


def dequantised_weights(folder: Path, quantised: dict[str, Quantised]) -> dict[str, torch.Tensor]:
    """The checkpoint's weights with each packed one as its dequantised values (f32)."""
    state = {name: value.float() for name, value in load_file(folder / "model.safetensors").items()
             if not name.endswith(("qweight", "qzeros", "scales", "g_idx"))}
    state.update({name: torch.from_numpy(q.dequantized()) for name, q in quantised.items()})
    return state


def test_logits_match_hf_on_the_dequantised_weights(packed):
    _, folder, quantised, out = packed
    assert_logits_match(out, dequantised_weights(folder, quantised))


def test_act_order_is_re_encoded_with_the_error_printed(tmp_path, caplog):
    """desc_act scatters each group's columns over the rows: no artifact group holds one producer group, so the
    weights are re-encoded into int8 g128 from their dequantised values (int4 would add ~7% relative error; int8
    adds ~0.5%), and the converter prints the error."""
    quantised = write_checkpoint(tmp_path / "ckpt", ("gptq", 128, False, "gptq", True))
    with caplog.at_level(logging.INFO, logger="ninfer.artifact.convert"):
        out = convert_layers_as("int4", tmp_path / "ckpt", tmp_path / "m.ninfer")
    reports = [r.getMessage() for r in caplog.records if "layers.0.mlp.down:" in r.getMessage()]
    assert len(reports) == 1 and "re-encoded as int8 g128, relative error" in reports[0]
    printed = float(reports[0].rsplit(" ", 1)[1])
    with read_artifact(out) as artifact:
        entry = artifact.tensor("layers.0.mlp.down")
        stored = decode(artifact.tensor_bytes(entry["name"]), "int8", entry["shape"], entry["group_size"])
    values = quantised["model.layers.0.mlp.down_proj.weight"].dequantized()
    measured = float(np.linalg.norm(stored - values) / np.linalg.norm(values))
    assert printed == pytest.approx(measured, rel=1e-2) and 1e-3 < measured < 1e-2


@pytest.mark.parametrize("change, message", [
    ({"bits": 8}, "8-bit weights"),
    ({"quant_method": "awq", "version": "gemv"}, "the 'gemv' packing"),
    ({"checkpoint_format": "marlin"}, "checkpoint format 'marlin'"),
])
def test_other_schemes_are_refused_by_name(tmp_path, change, message):
    write_checkpoint(tmp_path, SCHEMES["gptq-sym-g128"])
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"].update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match=f"not supported: {message}"):
        convert(tmp_path, tmp_path / "out.ninfer", progress=False)


def test_a_v1_zero_nibble_of_15_is_refused(tmp_path):
    """The 'gptq' v1 format stores zero - 1: a nibble of 15 would be a zero point of 16, outside int4."""
    write_checkpoint(tmp_path, SCHEMES["gptq-asym-g32"])
    state = load_file(tmp_path / "model.safetensors")
    state["model.layers.0.mlp.up_proj.qzeros"][0, 0] |= 0xF
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConversionError, match="up_proj.qzeros holds a zero point of 16"):
        convert(tmp_path, tmp_path / "out.ninfer", progress=False)


def test_a_scale_of_the_wrong_shape_is_refused(tmp_path):
    write_checkpoint(tmp_path, SCHEMES["awq-g64"])
    state = load_file(tmp_path / "model.safetensors")
    state["model.layers.0.mlp.down_proj.scales"] = state["model.layers.0.mlp.down_proj.scales"][:3].clone()
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConversionError, match=r"down_proj.scales has shape \[3, 256\]; awq int4 \[256, 384\] with "
                                              r"groups of 64 needs \[6, 256\]"):
        convert(tmp_path, tmp_path / "out.ninfer", progress=False)
