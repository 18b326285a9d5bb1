"""bench/peer_gguf.py (the random GGUFs llama.cpp's own benchmark runs on) at tiny shapes, read back by the gguf-py
of the pinned llama.cpp (tests/llama_cpp_gguf.py's llama_cpp_tree): the tensors are the ones gguf-py's table lists
for the architecture, with the shapes llama.cpp's loader derives from the file's own metadata (src/models/qwen35.cpp,
qwen35moe.cpp), the mix's anchor types, and values that dequantize finite and small. That llama.cpp loads and runs
these files, and that the Q4_K_M types are llama-quantize's, bench/peer_llamacpp.sh checks with the built tools.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from llama_cpp_gguf import llama_cpp_tree

REPO = Path(__file__).resolve().parent.parent

# Runs under the tree's gguf-py: every field and tensor of the file, with statistics of the dequantized values.
READ_BACK = r"""
import json, sys
import numpy as np
import gguf
reader = gguf.GGUFReader(sys.argv[1])
arch = reader.fields["general.architecture"].contents()
arch_enum = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
names = [gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch_enum]]
tensors = {}
for t in reader.tensors:
    w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64)
    tensors[t.name] = {"type": t.tensor_type.name, "ne": [int(n) for n in t.shape], "bytes": int(t.n_bytes),
                       "finite": bool(np.isfinite(w).all()), "mean": float(w.mean()), "std": float(w.std())}
fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
print(json.dumps({"fields": fields, "tensors": tensors, "names": names}))
"""


@pytest.fixture(scope="module")
def gguf_py(pytestconfig) -> Path:
    return llama_cpp_tree(Path(pytestconfig.cache.mkdir("qwen35-gguf"))) / "gguf-py"


def _run(gguf_py: Path, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(gguf_py))
    run = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def _written(gguf_py: Path, tmp_path: Path, model: str, mix: str) -> dict:
    out = tmp_path / f"{model}-{mix}.gguf"
    _run(gguf_py, str(REPO / "bench" / "peer_gguf.py"), "--model", model, "--mix", mix, "--out", str(out))
    back = json.loads(_run(gguf_py, "-c", READ_BACK, str(out)))
    back["size"] = int(_run(gguf_py, str(REPO / "bench" / "peer_gguf.py"), "--model", model, "--mix", mix, "--size"))
    return back


def _loader_shapes(fields: dict) -> dict[str, list[int]]:
    """The ne shape llama.cpp's loader asks for, per tensor name with `{i}` for the layer, from the metadata
    (load_arch_tensors of qwen35 / qwen35moe), and which layers are full attention."""
    a = fields["general.architecture"]
    f = {k.removeprefix(a + "."): v for k, v in fields.items()}
    e, vocab, hd, n_h, n_kv = (f["embedding_length"], f["vocab_size"], f["attention.key_length"],
                               f["attention.head_count"], f["attention.head_count_kv"])
    state, n_k, n_v, inner = f["ssm.state_size"], f["ssm.group_count"], f["ssm.time_step_rank"], f["ssm.inner_size"]
    conv = 2 * state * n_k + n_v * state
    assert inner == n_v * state
    shapes = {"token_embd.weight": [e, vocab], "output.weight": [e, vocab], "output_norm.weight": [e],
              "attn_norm": [e], "post_attention_norm": [e],
              "attn_q": [e, 2 * hd * n_h], "attn_k": [e, hd * n_kv], "attn_v": [e, hd * n_kv],
              "attn_output": [hd * n_h, e], "attn_q_norm": [hd], "attn_k_norm": [hd],
              "attn_qkv": [e, conv], "attn_gate": [e, inner], "ssm_conv1d": [f["ssm.conv_kernel"], conv],
              "ssm_dt": [n_v], "ssm_a": [n_v], "ssm_beta": [e, n_v], "ssm_alpha": [e, n_v], "ssm_norm": [state],
              "ssm_out": [inner, e]}
    if "expert_count" in f:
        n_exp, ff, sh = f["expert_count"], f["expert_feed_forward_length"], f["expert_shared_feed_forward_length"]
        shapes |= {"ffn_gate_inp": [e, n_exp], "ffn_gate_exps": [e, ff, n_exp], "ffn_up_exps": [e, ff, n_exp],
                   "ffn_down_exps": [ff, e, n_exp], "ffn_gate_inp_shexp": [e], "ffn_gate_shexp": [e, sh],
                   "ffn_up_shexp": [e, sh], "ffn_down_shexp": [sh, e]}
    else:
        ff = f["feed_forward_length"]
        shapes |= {"ffn_gate": [e, ff], "ffn_up": [e, ff], "ffn_down": [ff, e]}
    return shapes


ATTENTION = {"attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm"}
RECURRENT = {"attn_qkv", "attn_gate", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_beta", "ssm_alpha", "ssm_norm", "ssm_out"}


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize("mix", ["Q4_K_M", "Q8_0"])
def test_peer_gguf_reads_back_as_llama_cpp_loads_it(gguf_py, tmp_path, model, mix):
    back = _written(gguf_py, tmp_path, model, mix)
    fields, tensors = back["fields"], back["tensors"]
    arch = fields["general.architecture"]
    assert arch == ("qwen35moe" if model == "tiny-moe" else "qwen35")
    assert fields["tokenizer.ggml.model"] == "none"
    assert fields["general.file_type"] == {"Q4_K_M": 15, "Q8_0": 7}[mix]  # llama_ftype
    recurrent = fields[f"{arch}.attention.recurrent_layers"]
    assert len(recurrent) == fields[f"{arch}.block_count"] and not all(recurrent) and any(recurrent)

    # Exactly the tensors the loader asks for, each with its shape, each name one of gguf-py's for the arch.
    shapes = _loader_shapes(fields)
    expected = {n: s for n, s in shapes.items() if "." in n}
    for i, is_recurrent in enumerate(recurrent):
        for kind, shape in shapes.items():
            if "." not in kind and not (kind in ATTENTION and is_recurrent or kind in RECURRENT and not is_recurrent):
                suffix = "" if kind == "ssm_a" else ".bias" if kind == "ssm_dt" else ".weight"
                expected[f"blk.{i}.{kind}{suffix}"] = shape
    assert {n: t["ne"] for n, t in tensors.items()} == expected
    known = {pattern.format(bid=i) for pattern in back["names"] for i in range(len(recurrent))}
    assert {n.removesuffix(".weight").removesuffix(".bias") for n in tensors} <= known
    assert sum(t["bytes"] for t in tensors.values()) == back["size"]

    # The mix: weights quantised, the rest F32 as llama.cpp's converter writes them; Q4_K_M's output in Q6_K.
    for name, t in tensors.items():
        control = len(t["ne"]) == 1 or "_norm" in name or "ffn_gate_inp." in name or "ssm_conv1d" in name
        allowed = {"F32"} if control else {"Q8_0"} if mix == "Q8_0" else {"Q4_K", "Q6_K"}
        assert t["type"] in allowed, name
        assert t["finite"], name
        if not control:  # random weights around zero with a small spread
            assert abs(t["mean"]) < 0.03 and 0.005 < t["std"] < 0.05, (name, t)
    if mix == "Q4_K_M":
        assert tensors["output.weight"]["type"] == "Q6_K" and tensors["token_embd.weight"]["type"] == "Q4_K"
        assert 0 < sum(t["type"] == "Q6_K" for t in tensors.values()) < len(recurrent) * 2
    assert all(abs(tensors[n]["mean"] - 1) < 0.05 for n in tensors if n.endswith("attn_norm.weight"))
    assert all(tensors[n]["mean"] < -1 for n in tensors if n.endswith(".ssm_a"))
