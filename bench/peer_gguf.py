"""Random-weight GGUFs at the real Qwen3.5 shapes for llama.cpp's own benchmark (bench/peer_llamacpp.sh), written
with the gguf-py of the llama.cpp being measured (put its directory first on PYTHONPATH).

    python bench/peer_gguf.py --model qwen3.5-27b --mix Q4_K_M --out FILE      # write the file
    python bench/peer_gguf.py --model qwen3.5-27b --mix Q4_K_M --size          # its size in bytes, nothing written
    python bench/peer_gguf.py --model tiny-dense --mix Q4_K_M --check QUANTIZED  # our mix vs llama-quantize's

Architectures `qwen35` / `qwen35moe` with the metadata keys and tensors llama.cpp's loader reads for them
(src/models/qwen35.cpp, qwen35moe.cpp, llama_model_base::load_hparams; /work/shared/reference/gguf-qwen35.md), no
MTP block, and no vocabulary: `tokenizer.ggml.model` "none" with `<arch>.vocab_size` tokens, which the loader turns
into dummy tokens (llama-bench feeds random token ids and never detokenises). Shapes are bench/synthetic.py's MODELS
(the published configs) plus two tiny ones for tests.

Tensor types are those llama-quantize picks for the mix from a bf16 file (llama-quant.cpp, no imatrix): see
`quant_types`. `--check` compares them with a file llama-quantize wrote from this writer's F32 file of the same model.

The values are random: speed does not depend on them, but they are valid blocks with small f16 scales (Q8_0 blocks
quantised by gguf-py from N(0, 0.02); K-quant blocks from tests/llama_cpp_gguf.py's random_k_blocks), norms near 1
and decay rates in range, so every activation stays finite (a NaN in the MoE router would turn its top-k into noise).
A tensor is written as a run of blocks from a 16 MiB pool per type, starting at a random block: the file streams to
disk at write speed and never sits in memory.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests"), str(ROOT / "python")]

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter, LlamaFileType, quants
from llama_cpp_gguf import random_k_blocks
from synthetic import MODELS as PUBLISHED


def _tiny(base: str, **changes) -> dict:
    """A small variant of a published config whose matrices are all whole K-quant super-blocks wide (256), so the
    Q4_K_M mix takes the same branches as at the real shapes; 16 layers give use_more_bits both answers."""
    layers = 16
    config = PUBLISHED[base] | {"vocab_size": 1024, "hidden_size": 256, "num_layers": layers, "num_heads": 2,
                                "num_kv_heads": 1, "max_position_embeddings": 4096,
                                "layer_types": [PUBLISHED[base]["layer_types"][i] for i in range(layers)],
                                "linear_attention": PUBLISHED[base]["linear_attention"] | {"num_key_heads": 1,
                                                                                           "num_value_heads": 2}}
    return config | changes


MODELS = {
    "qwen3.5-27b": PUBLISHED["qwen3.5-27b"],
    "qwen3.5-35b-a3b": PUBLISHED["qwen3.5-35b-a3b"],
    "tiny-dense": _tiny("qwen3.5-27b", intermediate_size=512),
    # 16 experts, not 8: llama-quant.cpp has extra rules for exactly 8 experts, which no Qwen3.5 model has.
    "tiny-moe": _tiny("qwen3.5-35b-a3b", moe={"num_experts": 16, "top_k": 4, "intermediate_size": 256,
                                              "shared_intermediate_size": 256}),
}
# mix -> (the type of a tensor llama-quantize quantises with no rule of its own, general.file_type)
MIXES = {"Q4_K_M": ("Q4_K", LlamaFileType.MOSTLY_Q4_K_M), "Q8_0": ("Q8_0", LlamaFileType.MOSTLY_Q8_0),
         "F32": ("F32", LlamaFileType.ALL_F32)}
POOL_BYTES = 16 << 20


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # row-major (numpy) order: ggml's ne reversed
    control: str | None = None  # a small F32 tensor's kind of values (see _control_values); None: a weight


def tensors(config: dict) -> list[Tensor]:
    """Every tensor of the model in file order (llama.cpp's converter's order within a block)."""
    h, vocab = config["hidden_size"], config["vocab_size"]
    la = config["linear_attention"]
    hd, n_v = config["head_dim"], la["num_value_heads"]
    kd, vd = la["num_key_heads"] * la["key_head_dim"], n_v * la["value_head_dim"]
    out = [Tensor("token_embd.weight", (vocab, h))]
    for i, kind in enumerate(config["layer_types"]):
        p = f"blk.{i}."
        out.append(Tensor(p + "attn_norm.weight", (h,), "norm"))
        if kind == "full_attention":
            out += [Tensor(p + "attn_q.weight", (2 * hd * config["num_heads"], h)),  # query and gate
                    Tensor(p + "attn_k.weight", (hd * config["num_kv_heads"], h)),
                    Tensor(p + "attn_v.weight", (hd * config["num_kv_heads"], h)),
                    Tensor(p + "attn_output.weight", (h, hd * config["num_heads"])),
                    Tensor(p + "attn_q_norm.weight", (hd,), "norm"), Tensor(p + "attn_k_norm.weight", (hd,), "norm")]
        else:
            out += [Tensor(p + "ssm_a", (n_v,), "decay"),
                    Tensor(p + "ssm_conv1d.weight", (2 * kd + vd, la["conv_kernel"]), "small"),
                    Tensor(p + "ssm_dt.bias", (n_v,), "small"),
                    Tensor(p + "ssm_alpha.weight", (n_v, h)), Tensor(p + "ssm_beta.weight", (n_v, h)),
                    Tensor(p + "attn_qkv.weight", (2 * kd + vd, h)), Tensor(p + "attn_gate.weight", (vd, h)),
                    Tensor(p + "ssm_norm.weight", (la["value_head_dim"],), "ones"),
                    Tensor(p + "ssm_out.weight", (h, vd))]
        if config["moe"]:
            m = config["moe"]
            e, inter, shared = m["num_experts"], m["intermediate_size"], m["shared_intermediate_size"]
            out += [Tensor(p + "ffn_down_exps.weight", (e, h, inter)), Tensor(p + "ffn_gate_exps.weight", (e, inter, h)),
                    Tensor(p + "ffn_up_exps.weight", (e, inter, h)), Tensor(p + "ffn_gate_inp.weight", (e, h), "small"),
                    Tensor(p + "ffn_down_shexp.weight", (h, shared)), Tensor(p + "ffn_gate_shexp.weight", (shared, h)),
                    Tensor(p + "ffn_up_shexp.weight", (shared, h)),
                    Tensor(p + "ffn_gate_inp_shexp.weight", (h,), "small")]
        else:
            inter = config["intermediate_size"]
            out += [Tensor(p + "ffn_down.weight", (h, inter)), Tensor(p + "ffn_gate.weight", (inter, h)),
                    Tensor(p + "ffn_up.weight", (inter, h))]
        out.append(Tensor(p + "post_attention_norm.weight", (h,), "norm"))
    return out + [Tensor("output_norm.weight", (h,), "norm"), Tensor("output.weight", (vocab, h))]


def _quantised(tensor: Tensor) -> bool:
    """llama-quant.cpp's tensor_allows_quantization for these names: 2-D and 3-D tensors whose name ends in
    `weight`, except norms, the expert router and the GDN conv taps (here: exactly the `control` tensors but the
    router, whose 2-D F32 rows llama-quantize keeps as they are)."""
    name = tensor.name
    return (len(tensor.shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name and "ssm_conv1d" not in name)


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def quant_types(model: list[Tensor], mix: str, n_layers: int) -> dict[str, str]:
    """The type llama-quantize (llama-quant.cpp's llama_tensor_get_type_impl, no imatrix, untied output) gives each
    tensor for `mix`. Q8_0 and F32: every quantised tensor in that type. Q4_K_M: Q4_K except `output.weight` Q6_K;
    the attn_v-like tensors (`attn_v` and the GDN `attn_qkv`, one counter over both in file order; llama-quant's
    separate attn_qkv rule is never reached for them) Q6_K where use_more_bits(i, n) holds; and every `ffn_down*`
    (dense, routed and shared) Q6_K where use_more_bits(layer, n_layers) holds (the dense counter is the layer
    index: one ffn_down per layer, in order; with experts llama-quant parses the layer from the name). Tensors it
    does not quantise stay F32, as llama.cpp's converter writes them."""
    default = MIXES[mix][0]
    attn_v_like = [t.name for t in model if _quantised(t) and ("attn_v.weight" in t.name or "attn_qkv.weight" in t.name)]
    types = {}
    for tensor in model:
        name = tensor.name
        qtype = default if _quantised(tensor) else "F32"
        more_bits = (name == "output.weight"
                     or name in attn_v_like and _use_more_bits(attn_v_like.index(name), len(attn_v_like))
                     or "ffn_down" in name and _use_more_bits(int(name.split(".")[1]), n_layers))
        if mix == "Q4_K_M" and qtype != "F32" and more_bits:
            qtype = "Q6_K"
        block = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]
        if tensor.shape[-1] % block:  # llama-quantize would fall back to another type; no published shape needs it
            raise ValueError(f"{name}: {tensor.shape[-1]} columns are not whole {qtype} blocks of {block}")
        types[name] = qtype
    return types


def tensor_bytes(tensor: Tensor, qtype: str) -> int:
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    return int(np.prod(tensor.shape)) // block * block_bytes


def _pool(qtype: str, rng: np.random.Generator) -> np.ndarray:
    """~POOL_BYTES of valid, random blocks of `qtype`, flat uint8."""
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    rows = POOL_BYTES // block_bytes // 256  # rows of 256 blocks (gguf-py's quantizer pays per row)
    if qtype in ("Q4_K", "Q5_K", "Q6_K"):
        return random_k_blocks(rows, 256 * block, qtype, rng).reshape(-1)
    values = rng.standard_normal((rows, 256 * block), dtype=np.float32) * 0.02
    return np.ascontiguousarray(quants.quantize(values, GGMLQuantizationType[qtype])).view(np.uint8).reshape(-1)


def _control_values(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Norm gains as llama.cpp's converter stores them (1 + w, near 1), ones (the GDN norm, stored as is),
    `ssm_a` = -exp(A_log) with A_log in [0, log 16] as in the checkpoints, or small values (conv taps, dt bias,
    the routers)."""
    if kind == "norm":
        return (1 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "ones":
        return np.ones(shape, np.float32)
    if kind == "decay":
        return (-rng.uniform(1, 16, shape)).astype(np.float32)
    return (0.02 * rng.standard_normal(shape)).astype(np.float32)


def _blocks(pool: np.ndarray, block_bytes: int, nbytes: int, rng: np.random.Generator) -> Iterator[memoryview]:
    """`nbytes` of blocks from the pool, from a random block on, wrapping around."""
    at = int(rng.integers(pool.size // block_bytes)) * block_bytes
    while nbytes:
        piece = pool[at:at + nbytes]
        yield memoryview(piece)
        nbytes -= piece.size
        at = 0


def _add_metadata(writer: GGUFWriter, config: dict, mix: str, name: str) -> None:
    la, rope = config["linear_attention"], config["rope"]
    writer.add_name(f"ninfer peer benchmark: random {name} {mix}")
    writer.add_file_type(MIXES[mix][1])
    writer.add_quantization_version(2)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_layers"])
    writer.add_head_count(config["num_heads"])
    writer.add_head_count_kv(config["num_kv_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(rope["theta"])
    writer.add_rope_dimension_count(rope["rotary_dim"])
    writer.add_rope_dimension_sections(list(rope["mrope_section"]) + [0])
    writer.add_ssm_conv_kernel(la["conv_kernel"])
    writer.add_ssm_state_size(la["key_head_dim"])
    writer.add_ssm_group_count(la["num_key_heads"])
    writer.add_ssm_time_step_rank(la["num_value_heads"])
    writer.add_ssm_inner_size(la["num_value_heads"] * la["value_head_dim"])
    writer.add_recurrent_layers([kind == "linear_attention" for kind in config["layer_types"]])
    if config["moe"]:
        moe = config["moe"]
        writer.add_expert_count(moe["num_experts"])
        writer.add_expert_used_count(moe["top_k"])
        writer.add_expert_feed_forward_length(moe["intermediate_size"])
        writer.add_expert_shared_feed_forward_length(moe["shared_intermediate_size"])
    else:
        writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_tokenizer_model("none")
    writer.add_vocab_size(config["vocab_size"])


def file_bytes(name: str, mix: str) -> int:
    """The tensor data's size (the header adds a few KB)."""
    config = MODELS[name]
    model = tensors(config)
    types = quant_types(model, mix, config["num_layers"])
    return sum(tensor_bytes(t, types[t.name]) for t in model)


def write_gguf(name: str, mix: str, out: Path, seed: int = 0) -> dict[str, str]:
    """Writes the model's random GGUF to `out` (via out.partial, renamed when complete); returns its tensor types."""
    config = MODELS[name]
    model = tensors(config)
    types = quant_types(model, mix, config["num_layers"])
    rng = np.random.default_rng(seed)
    arch = "qwen35moe" if config["moe"] else "qwen35"
    partial = out.with_name(out.name + ".partial")
    writer = GGUFWriter(str(partial), arch)
    _add_metadata(writer, config, mix, name)
    controls = {}
    for tensor in model:
        qtype = GGMLQuantizationType[types[tensor.name]]
        if tensor.control:
            controls[tensor.name] = _control_values(tensor.control, tensor.shape, rng)
        writer.add_tensor_info(tensor.name, tensor.shape, np.dtype(np.float32), tensor_bytes(tensor, types[tensor.name]),
                               raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    pools: dict[str, np.ndarray] = {}
    fout = writer.fout[0]
    for tensor in model:  # what GGUFWriter.write_tensor_data does, streamed: each tensor starts aligned
        qtype, nbytes = types[tensor.name], tensor_bytes(tensor, types[tensor.name])
        writer.write_padding(fout, fout.tell())
        if tensor.name in controls:
            fout.write(controls[tensor.name].tobytes())
        else:
            if qtype not in pools:
                pools[qtype] = _pool(qtype, rng)
            pool = pools[qtype]
            for piece in _blocks(pool, GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][1], nbytes, rng):
                fout.write(piece)
        writer.write_padding(fout, nbytes)
    writer.close()
    partial.rename(out)
    return types


def check_mix(name: str, mix: str, quantized: Path) -> list[str]:
    """Where `quant_types` differs from the types in `quantized` (llama-quantize's output for this model's F32 file)."""
    config = MODELS[name]
    ours = quant_types(tensors(config), mix, config["num_layers"])
    theirs = {t.name: t.tensor_type.name for t in GGUFReader(quantized).tensors}
    return [f"{n}: ours {ours.get(n)}, llama-quantize {theirs.get(n)}" for n in sorted(ours.keys() | theirs.keys())
            if ours.get(n) != theirs.get(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--mix", choices=MIXES, required=True)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--out", type=Path, help="write the GGUF here")
    action.add_argument("--size", action="store_true", help="print the tensor data's size in bytes")
    action.add_argument("--check", type=Path, metavar="QUANTIZED", help="compare the mix with llama-quantize's file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.size:
        print(file_bytes(args.model, args.mix))
    elif args.check:
        problems = check_mix(args.model, args.mix, args.check)
        print("\n".join(problems) or f"{args.model} {args.mix}: every tensor type is llama-quantize's")
        sys.exit(1 if problems else 0)
    else:
        types = write_gguf(args.model, args.mix, args.out, args.seed)
        counts = {q: sum(1 for t in types.values() if t == q) for q in sorted(set(types.values()))}
        print(f"{args.out}: {args.out.stat().st_size / 2**30:.2f} GiB, tensors {counts}")


if __name__ == "__main__":
    main()
