"""GGUF test files written by llama.cpp's own converter, for the Qwen3.5 GGUF import tests.

    llama_cpp_tree(cache) -> Path
        `convert_hf_to_gguf.py` with its `conversion/` package and `gguf-py`, extracted from the pinned
        llama-cpp-python sdist (python/ninfer/serve/webui/pin.json; fetched and checked by webui/build_llama_ui.py's
        own download_sdist / verify_sdist, so a fresh machine needs only PyPI) once into `cache`.
    llama_cpp_convert(tree, folder, out, outtype, *options) -> Path
        That converter run on a HF folder (`--outtype bf16`, `q8_0`, ...; `--no-mtp` for a checkpoint without MTP
        weights, which it otherwise requires), in a subprocess with its own gguf-py; kept at `out` once written.
    add_qwen35_tokenizer(folder)
        The real 248k Qwen3.5 tokenizer and the project's qwen3_5 chat template saved into a HF folder with
        transformers' save_pretrained (the converter reads them from there and writes them into the file).
    requantize_k(src, out, types, seed) -> dict[str, np.ndarray]
        A copy of the GGUF `src` whose tensors named in `types` hold random, valid K-quant blocks of the given type
        (gguf-py has no K-quant quantizer; its `quants` dequantizer defines what the blocks mean). Returns those
        tensors dequantized by gguf-py, in row-major shape: the weights the file now holds.
    random_k_blocks(rows, cols, qtype, rng) -> np.ndarray
        `rows` rows of `cols` values as random, valid blocks of a K-quant type (uint8, one array row per row), f16
        scales keeping the dequantized weights small (also the blocks of bench/peer_gguf.py, llama.cpp's benchmark).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
_VENDOR = "vendor/llama.cpp"
_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def _build_llama_ui():
    spec = importlib.util.spec_from_file_location("build_llama_ui", REPO / "webui" / "build_llama_ui.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def llama_cpp_tree(cache: Path) -> Path:
    build = _build_llama_ui()
    pin = build.PIN
    tree = Path(cache) / f"llama.cpp-{pin['version']}"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    sdist = build.verify_sdist(build.download_sdist(Path(cache)), pin["size"], pin["sha256"])
    prefix = f"{sdist.name.removesuffix('.tar.gz')}/{_VENDOR}/"
    staging = Path(tempfile.mkdtemp(prefix=".llama.cpp-", dir=cache))
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(prefix) and m.name[len(prefix):].startswith(_MEMBERS)]
        tar.extractall(staging, members=members, filter="data")
    os.rename(staging / prefix, tree)
    return tree


def llama_cpp_convert(tree: Path, folder: Path, out: Path, outtype: str, *options: str) -> Path:
    if out.is_file():
        return out
    partial = out.with_name(out.name + ".partial")
    env = dict(os.environ, PYTHONPATH=str(tree / "gguf-py"))
    run = subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(folder), "--outfile",
                          str(partial), "--outtype", outtype, *options], env=env, capture_output=True, text=True, check=False)
    if run.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({run.returncode}):\n{run.stderr[-3000:]}")
    partial.rename(out)
    return out


def add_qwen35_tokenizer(folder: Path) -> None:
    from ninfer.artifact.tokenizer_build import qwen35_tokenizer_json
    from ninfer.frontend.templates import load_chat_template
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(qwen35_tokenizer_json()),
                                        eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = load_chat_template("qwen3_5")
    tokenizer.save_pretrained(folder)


# K-quant block layouts (ggml-common.h, as gguf-py's dequantizers read them): bytes per 256 values and where the f16
# super-block scales sit, with a magnitude for each that keeps the dequantized weights around 0.05.
_K_BLOCKS = {
    "Q4_K": (144, {0: 5e-5, 2: 4e-4}),  # d, dmin, scales[12], qs[128]
    "Q5_K": (176, {0: 2.5e-5, 2: 4e-4}),  # d, dmin, scales[12], qh[32], qs[128]
    "Q6_K": (210, {208: 1e-5}),  # ql[128], qh[64], scales[16] (int8), d
}


def random_k_blocks(rows: int, cols: int, qtype: str, rng: np.random.Generator) -> np.ndarray:
    block_bytes, scales = _K_BLOCKS[qtype]
    blocks = rng.integers(0, 256, (rows, cols // 256, block_bytes), dtype=np.uint8)
    for at, magnitude in scales.items():
        value = (rng.uniform(0.5, 1.5, (rows, cols // 256)) * magnitude).astype(np.float16)
        blocks[..., at:at + 2] = value[..., None].view(np.uint8).reshape(rows, cols // 256, 2)
    return blocks.reshape(rows, cols // 256 * block_bytes)


def requantize_k(src: Path, out: Path, types: dict[str, str], seed: int) -> dict[str, np.ndarray]:
    """See the module doc. Metadata is copied with the value types our reader and llama.cpp's both accept."""
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, quants
    from ninfer.artifact.gguf_file import GGUFFile

    source = GGUFFile(src)
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(out), str(source.fields["general.architecture"]))
    for key, value in source.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        writer.add_key_value(key, value, *_value_type(value, GGUFValueType))
    weights = {}
    for tensor in source.tensors:
        if tensor.name not in types:
            writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
            continue
        qtype = GGMLQuantizationType[types[tensor.name]]
        cols, rows = int(tensor.shape[0]), int(np.prod(tensor.shape[1:]))
        blocks = random_k_blocks(rows, cols, qtype.name, rng).reshape(tuple(reversed(tensor.shape[1:].tolist()))
                                                                        + (-1,))
        writer.add_tensor(tensor.name, blocks, raw_dtype=qtype)
        weights[tensor.name] = np.asarray(quants.dequantize(blocks, qtype), dtype=np.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def _value_type(value: object, types) -> tuple:
    def scalar(v: object):
        if isinstance(v, bool):
            return types.BOOL
        if isinstance(v, int):
            return types.INT32 if -(2**31) <= v < 2**31 else types.UINT64
        if isinstance(v, float):
            return types.FLOAT32
        return types.STRING

    if isinstance(value, list):
        return types.ARRAY, scalar(value[0]) if value else types.INT32
    return (scalar(value),)
