"""Qwen3.5 GGUF import (llama.cpp's `qwen35` / `qwen35moe`): files written by llama.cpp's own converter from tiny
checkpoints saved with transformers' save_pretrained convert into the artifact the HF folder converts into, and the
engine's logits match HF transformers on the weights the file holds.

- bf16 files: the artifact equals the HF-derived one tensor by tensor (norms un-folded, A_log from -exp(A_log), the
  value heads back in HF's order, the MTP block), and the logits match HF's from_pretrained of the folder.
- q8_0 files: every Q8_0 block is kept (int8 g32, never re-quantised), and the logits match HF run on the
  checkpoint's weights rounded by gguf's Q8_0 quantizer (the one llama.cpp's converter calls).
- K-quants (Q4_K, Q5_K, Q6_K): random valid blocks put into a converted file (gguf-py can read but not write them);
  the logits match HF run on gguf's dequantization of those blocks, and the re-encoding prints its error.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from llama_cpp_gguf import add_qwen35_tokenizer, llama_cpp_convert, llama_cpp_tree, requantize_k
from logit_tolerance import F32_TOL, logit_tolerance
from ninfer import _testing
from ninfer.artifact.convert import convert
from ninfer.artifact.encodings import decode
from ninfer.artifact.gguf_file import GGUFFile
from ninfer.artifact.reader import read_artifact
from ninfer.artifact.tokenizer_build import qwen35_tokenizer_json
from ninfer.frontend.templates import load_chat_template
from tiny_models import _perturb, build_tiny_checkpoint, load_reference_vlm
from tokenizers import Tokenizer

VOCAB = 248320
# The dense model is wide enough for K-quants (256-column super-blocks) and has value heads of 64, whole Q8_0
# blocks, so the column reorder of ssm_out moves whole blocks; Hv = 2 Hk so llama.cpp reorders the value heads.
WIDE_DENSE = {
    "vocab_size": VOCAB, "hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 512,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "initializer_range": 0.05,
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                        "mrope_section": [4, 2, 2], "mrope_interleaved": True},
}
# GGUF block tensor kind -> the HF name after `layers.i.` (text-only layout), for the weights a test replaces.
HF_NAMES = {
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_qkv": "linear_attn.in_proj_qkv", "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b", "ssm_alpha": "linear_attn.in_proj_a", "ssm_out": "linear_attn.out_proj",
    "ffn_gate_inp": "mlp.gate", "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj", "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
K_TYPES = {"blk.{i}.ffn_gate.weight": "Q4_K", "blk.{i}.ffn_up.weight": "Q5_K", "blk.{i}.ffn_down.weight": "Q6_K"}


def hf_name(gguf_name: str, prefix: str) -> str:
    if gguf_name == "output.weight":
        return "lm_head.weight"
    if gguf_name == "token_embd.weight":
        return prefix + "embed_tokens.weight"
    layer, kind = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name).groups()
    return f"{prefix}layers.{layer}.{HF_NAMES[kind]}.weight"


def _save_wide_dense(folder: Path) -> None:
    import transformers

    config = transformers.AutoConfig.for_model("qwen3_5_text", **WIDE_DENSE)
    torch.manual_seed(3)
    model = transformers.Qwen3_5ForCausalLM(config)
    _perturb(model, torch.Generator().manual_seed(3))
    model.to(torch.bfloat16).save_pretrained(folder)


@pytest.fixture(scope="module")
def gguf_cache(pytestconfig) -> Path:
    return Path(pytestconfig.cache.mkdir("qwen35-gguf"))


@pytest.fixture(scope="module")
def llama_cpp(gguf_cache) -> Path:
    return llama_cpp_tree(gguf_cache)


def _folder(cache: Path, name: str, build) -> Path:
    """A HF folder with the real tokenizer and chat template, built once (staged, then renamed)."""
    folder = cache / name
    if not (folder / "tokenizer_config.json").is_file():
        staging = cache / f".{name}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        build(staging)
        add_qwen35_tokenizer(staging)
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    return folder


@pytest.fixture(scope="module")
def dense(gguf_cache) -> Path:
    return _folder(gguf_cache, "dense-v1", _save_wide_dense)


@pytest.fixture(scope="module")
def moe(gguf_cache, tiny_root) -> Path:
    """The tiny save_pretrained Qwen3.5-MoE (VLM layout, per-expert, MTP), copied under its own folder name (which
    names its builder version, so a rebuilt checkpoint is copied and converted anew)."""
    src = build_tiny_checkpoint("qwen3_5_moe", tiny_root)
    return _folder(gguf_cache, f"moe-{src.name}", lambda staging: shutil.copytree(src, staging))


def _gguf(llama_cpp: Path, folder: Path, outtype: str) -> Path:
    has_mtp = any(name.startswith("mtp.") for name in _tensor_names(folder))
    return llama_cpp_convert(llama_cpp, folder, folder.parent / f"{folder.name}-{outtype}.gguf", outtype,
                             *([] if has_mtp else ["--no-mtp"]))


def _tensor_names(folder: Path) -> list[str]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return list(json.loads(index.read_text())["weight_map"])
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", framework="pt") as f:
        return list(f.keys())


TOKENS = np.random.default_rng(7).integers(0, VOCAB, 40).astype(np.int32)


def engine_logits(artifact: Path) -> np.ndarray:
    model = _testing.Model.open(str(artifact), kv_dtype="f32", threads=2, max_context=512)
    return model.prefill(model.new_sequence(), TOKENS, all_logits=True)


def hf_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(TOKENS[None].astype(np.int64))).logits[0].numpy()


def dense_reference(folder: Path, replaced: dict[str, np.ndarray] | None = None):
    """HF's from_pretrained of the dense folder (fp32), with `replaced` (HF name -> values) put in."""
    import transformers

    model = transformers.Qwen3_5ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if replaced:
        state = model.state_dict()
        for name, values in replaced.items():
            assert state[name].shape == values.shape, name
            state[name] = torch.from_numpy(values)
        model.load_state_dict(state)
    return model


def assert_close(ours: np.ndarray, theirs: np.ndarray, tol: float) -> None:
    assert ours.shape == theirs.shape and np.isfinite(ours).all()
    error = float(np.abs(ours - theirs).max()) / float(np.abs(theirs).max())
    assert error <= tol, f"max |ours - HF| / max |HF| = {error:.2e} > {tol:.0e}"


def test_the_converter_wrote_qwen35_files(llama_cpp, dense, moe):
    for folder, arch in ((dense, "qwen35"), (moe, "qwen35moe")):
        file = GGUFFile(_gguf(llama_cpp, folder, "bf16"))
        assert file.fields["general.architecture"] == arch
        names = {t.name for t in file.tensors}
        assert {"blk.0.ssm_a", "blk.0.attn_qkv.weight", "blk.0.ssm_out.weight"} <= names
    assert "blk.8.nextn.eh_proj.weight" in names and "blk.0.ffn_gate_exps.weight" in names  # MoE: MTP, experts


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_bf16_gguf_is_the_hf_artifact(which, llama_cpp, request, tmp_path):
    folder = request.getfixturevalue(which)
    from_gguf = convert(_gguf(llama_cpp, folder, "bf16"), tmp_path / "gguf.ninfer", recipe="bf16", progress=False)
    from_hf = convert(folder, tmp_path / "hf.ninfer", recipe="bf16", progress=False)
    with read_artifact(from_gguf) as ours, read_artifact(from_hf) as theirs:
        # GGUF has no vision tower (llama.cpp writes it to a separate mmproj file).
        hf_names = {t["name"] for t in theirs.tensors if not t["name"].startswith("visual.")}
        assert {t["name"] for t in ours.tensors} == hf_names
        for key in ("layer_types", "linear_attention", "moe", "mtp", "rope", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "vocab_size", "norm_offset", "tie_word_embeddings", "eos_token_ids"):
            assert ours.config[key] == theirs.config[key], key
        for name in hf_names:
            entry, hf_entry = ours.tensor(name), theirs.tensor(name)
            assert (entry["encoding"], entry["shape"]) == (hf_entry["encoding"], hf_entry["shape"]), name
            got = decode(ours.tensor_bytes(name), entry["encoding"], entry["shape"], None)
            want = decode(theirs.tensor_bytes(name), hf_entry["encoding"], hf_entry["shape"], None)
            # A_log went through -exp (llama.cpp, in f32) and log (ours): a few f32 ulps of exp's value near 1.
            tol = 4e-7 if name.endswith("A_log") else 0
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)
    reference = dense_reference(folder) if which == "dense" else load_reference_vlm(folder)
    assert_close(engine_logits(from_gguf), hf_logits(reference), F32_TOL)


def test_tokenizer_and_chat_template_come_from_the_file(llama_cpp, dense, tmp_path):
    out = convert(_gguf(llama_cpp, dense, "bf16"), tmp_path / "m.ninfer", recipe="bf16", progress=False)
    with read_artifact(out) as artifact:
        frontend = artifact.frontend
    assert frontend["chat_templates"] == {"default": load_chat_template("qwen3_5")}
    assert frontend["special_tokens"]["eos"][:2] == [248046, 248044]
    ours, real = Tokenizer.from_str(frontend["tokenizer_json"]), Tokenizer.from_str(qwen35_tokenizer_json())
    text = ("<|im_start|>user\nWie viel kostet 12345 Äpfel? café naïve 東京 🙂<think>x</think><|im_end|>\n"
            "def f(x):\n\treturn x  # done\r\n")
    assert ours.encode(text).ids == real.encode(text).ids
    assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text


def _q8_0_rounded(values: np.ndarray) -> np.ndarray:
    return quants.dequantize(quants.quantize(values, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)


def test_q8_0_gguf_keeps_its_blocks_and_matches_hf_on_them(llama_cpp, dense, tmp_path):
    file = _gguf(llama_cpp, dense, "q8_0")
    # groupwise-int, except that the GDN gates it keeps in bf16 ask for int8 here: a quantised encoding keeps the
    # file's blocks, bf16 would round their values.
    recipe = tmp_path / "int.json"
    recipe.write_text(json.dumps({"base": "groupwise-int", "rules": [{"pattern": "*.gdn.in_[ab]", "encoding": "int8"}]}))
    out = convert(file, tmp_path / "q8.ninfer", recipe=str(recipe), progress=False)
    q8 = [t for t in GGUFFile(file).tensors if t.tensor_type == GGMLQuantizationType.Q8_0]
    assert len(q8) >= 20
    with read_artifact(out) as artifact:
        encodings = {(t["encoding"], t.get("group_size")) for t in artifact.tensors
                     if len(t["shape"]) == 2 and not t["name"].endswith(".gdn.conv")}
    assert encodings == {("int8", 32)}
    # HF on the checkpoint's weights rounded by gguf's Q8_0: rows and whole 32-column blocks are only moved by
    # llama.cpp's reorder, so rounding in HF's layout gives the file's values.
    reference = dense_reference(dense)
    state = reference.state_dict()
    for tensor in q8:
        name = hf_name(tensor.name, "model.")
        state[name] = torch.from_numpy(_q8_0_rounded(state[name].numpy()))
    reference.load_state_dict(state)
    assert_close(engine_logits(out), hf_logits(reference), logit_tolerance(out))


def test_k_quant_gguf_matches_hf_on_its_dequantized_weights(llama_cpp, dense, tmp_path, caplog):
    types = {name.format(i=i): qtype for name, qtype in K_TYPES.items() for i in range(WIDE_DENSE["num_hidden_layers"])}
    types["output.weight"] = "Q6_K"
    file = tmp_path / "k.gguf"
    weights = requantize_k(_gguf(llama_cpp, dense, "bf16"), file, types, seed=5)
    reference = dense_reference(dense, {hf_name(name, "model."): values for name, values in weights.items()})
    theirs = hf_logits(reference)

    f32_recipe = tmp_path / "f32.json"
    f32_recipe.write_text(json.dumps({"rules": [{"pattern": "*", "encoding": "f32"}]}))
    assert_close(engine_logits(convert(file, tmp_path / "f32.ninfer", recipe=str(f32_recipe), progress=False)),
                 theirs, F32_TOL)

    with caplog.at_level(logging.WARNING, logger="ninfer.artifact.convert"):
        out = convert(file, tmp_path / "int.ninfer", recipe="groupwise-int", progress=False)
    printed = {m.group(1): (m.group(2), float(m.group(3))) for m in (
        re.match(r"(\S+): (?:re-encoded|rearranged) as (\S+ g\d+), relative error (\S+)", r.getMessage())
        for r in caplog.records)
        if m}
    assert set(printed) == {"lm_head"} | {f"layers.{i}.mlp.{p}" for i in range(4) for p in ("gate", "up", "down")}
    with read_artifact(out) as artifact:
        for name, (encoding, error) in printed.items():
            entry = artifact.tensor(name)
            assert encoding == f"{entry['encoding']} g{entry['group_size']}"
            stored = decode(artifact.tensor_bytes(name), entry["encoding"], entry["shape"], entry["group_size"])
            gguf_name = "output.weight" if name == "lm_head" else "blk.{}.ffn_{}.weight".format(*name.split(".")[1::2])
            values = weights[gguf_name]
            measured = float(np.linalg.norm(stored - values) / np.linalg.norm(values))
            assert error == pytest.approx(measured, rel=1e-2) and 0 < error < 1e-2, (name, error, measured)
            # Q4_K keeps its codes in int4_affine (no fewer bits, a quarter of int8's size); Q5_K/Q6_K go to int8.
            assert entry["encoding"] == ("int4_affine" if types.get(gguf_name) == "Q4_K" else "int8"), name
