"""Hugging Face safetensors folder -> `Source` (config normalisation and checkpoint-name mapping).

Supported: qwen3_5 / qwen3_5_moe (VLM layout `model.language_model.*` + `lm_head` + `mtp.*` + `model.visual.*`,
or the text-only layout `model.*`), llama, qwen2, qwen3; one `model.safetensors` or shards listed by
`model.safetensors.index.json`; routed experts fused (`mlp.experts.gate_up_proj`, transformers' in-memory layout) or
one tensor per expert (`mlp.experts.N.gate_proj.weight`, what save_pretrained and the published checkpoints write).
Tensors are read one at a time through safetensors' lazy `safe_open` (a per-expert projection: its experts, stacked);
nothing else of the model is held in memory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ninfer.artifact.convert import (
    QWEN35_EOS,
    QWEN35_PAD,
    Source,
    SourceTensor,
    decoder_config,
    unsupported_architecture,
)
from ninfer.artifact.format import PLAIN_DECODERS, QWEN35_FAMILY
from ninfer.artifact.gguf_blocks import NativeTensor
from ninfer.artifact.hf_gptq import gptq_layout
from ninfer.artifact.hf_int4 import packed_int4_scheme
from ninfer.artifact.hf_nvfp4 import (
    COMPRESSED_NVFP4_FORMAT,
    compressed_nvfp4_layout,
    modelopt_layout,
    stack_nvfp4,
)
from ninfer.artifact.hf_quantized import QuantizedLayout, QuantizedWeight
from ninfer.artifact.sampling_source import hf_sampling_defaults
from ninfer.errors import ConversionError

# model_type of text-only Qwen3.5 checkpoints (what Qwen3_5ForCausalLM saves) -> the family's arch name.
_QWEN35_TEXT_TYPES = {f"{arch}_text": arch for arch in QWEN35_FAMILY}  # a text-only checkpoint of each
_IGNORED = re.compile(r"(.*\.)?rotary_emb\.inv_freq$")  # a buffer older llama checkpoints saved

# Per-layer checkpoint names (after `layers.{i}.`) -> logical names (after `layers.{i}.`).
_LAYER_NAMES = {
    "input_layernorm.weight": "input_norm",
    "post_attention_layernorm.weight": "post_attn_norm",
    **{f"self_attn.{p}_proj.weight": f"attn.{p}_proj" for p in "qkvo"},
    **{f"self_attn.{p}_proj.bias": f"attn.{p}_bias" for p in "qkv"},
    "self_attn.q_norm.weight": "attn.q_norm",
    "self_attn.k_norm.weight": "attn.k_norm",
    "linear_attn.in_proj_qkv.weight": "gdn.in_qkv",
    "linear_attn.in_proj_z.weight": "gdn.in_z",
    "linear_attn.in_proj_b.weight": "gdn.in_b",
    "linear_attn.in_proj_a.weight": "gdn.in_a",
    "linear_attn.out_proj.weight": "gdn.out_proj",
    "linear_attn.conv1d.weight": "gdn.conv",  # [C, 1, K] -> [C, K]
    "linear_attn.A_log": "gdn.A_log",
    "linear_attn.dt_bias": "gdn.dt_bias",
    "linear_attn.norm.weight": "gdn.norm",
    "mlp.gate_proj.weight": "mlp.gate",
    "mlp.up_proj.weight": "mlp.up",
    "mlp.down_proj.weight": "mlp.down",
    "mlp.gate.weight": "moe.router",
    "mlp.experts.down_proj": "moe.experts_down",
    "mlp.shared_expert.gate_proj.weight": "moe.shared_gate",
    "mlp.shared_expert.up_proj.weight": "moe.shared_up",
    "mlp.shared_expert.down_proj.weight": "moe.shared_down",
    "mlp.shared_expert_gate.weight": "moe.shared_expert_gate",
}
_FUSED_EXPERTS = "mlp.experts.gate_up_proj"  # [E, 2I, H]: rows 0..I-1 gate, I..2I-1 up
# One routed expert's projection, [I, H] (gate, up) or [H, I] (down); stacked over N into the logical [E, ...].
_PER_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
_INDEX_FILE = "model.safetensors.index.json"
_TOP_NAMES = {"embed_tokens.weight": "embed", "norm.weight": "final_norm"}
_MTP_TOP_NAMES = {
    "fc.weight": "mtp.fc",
    "pre_fc_norm_embedding.weight": "mtp.pre_fc_norm_embedding",
    "pre_fc_norm_hidden.weight": "mtp.pre_fc_norm_hidden",
    "norm.weight": "mtp.norm",
}
_LAYER = re.compile(r"layers\.(\d+)\.(.+)")


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{path}: cannot read it as JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConversionError(f"{path}: expected a JSON object")
    return value


class _SafetensorsIndex:
    """Which file holds each checkpoint tensor, and its shape; reads tensors lazily, one at a time."""

    def __init__(self, folder: Path, block_size: tuple[int, int] | None = None,
                 layout: QuantizedLayout | None = None) -> None:
        """`block_size`: the checkpoint is block-wise FP8 (see fp8_block_scales); `layout`: its other
        pre-quantisation scheme (hf_quantized.py)."""
        from safetensors import safe_open

        self._safe_open = safe_open
        files = _safetensors_files(folder)
        self.file_of: dict[str, Path] = {}
        self.shape_of: dict[str, tuple[int, ...]] = {}
        self.dtype_of: dict[str, str] = {}  # safetensors' dtype names: "BF16", "F16", "I32", ...
        self.block_size = block_size
        self.scale_of: dict[str, str] = {}  # FP8 weight -> its `weight_scale_inv`
        for file in files:
            try:
                with safe_open(file, framework="pt") as f:
                    for name in f.keys():
                        self.file_of[name] = file
                        tensor = f.get_slice(name)
                        self.shape_of[name], self.dtype_of[name] = tuple(tensor.get_shape()), tensor.get_dtype()
            except Exception as exc:  # safetensors raises its own error types for a damaged header
                raise ConversionError(f"{file}: not a readable safetensors file: {exc}") from exc
        self.stored = set(self.file_of)  # the checkpoint's own tensor names
        self.auxiliary: set[str] = set()  # checkpoint tensors read as part of another (scales, packed parts)
        if block_size is not None:
            self.scale_of = fp8_block_scales(self.shape_of, block_size, folder)
            self.auxiliary |= set(self.scale_of.values())
        # Pre-quantised weights under their plain names `X.weight`, read through their layout.
        self.quantized: dict[str, QuantizedWeight] = {}
        if layout is not None:
            self.quantized = layout.weights(self.shape_of, self.dtype_of, self._read, folder)
            if not self.quantized:
                raise ConversionError(f"{folder}: the quantization config names a pre-quantised layout, but no "
                                      "checkpoint tensor is stored in it")
        for weight, quantized in self.quantized.items():
            self.file_of[weight], self.shape_of[weight] = self.file_of[quantized.anchor], quantized.shape
            self.auxiliary |= quantized.parts - {weight}

    def native(self, name: str) -> NativeTensor | None:
        """A pre-quantised weight's own artifact form; None for any other tensor."""
        quantized = self.quantized.get(name)
        return quantized.native if quantized is not None else None

    def stacked_native(self, names: list[str]) -> NativeTensor | None:
        """`native` of per-expert weights stacked like stacked_loader: each blob gets the new leading axis (nvfp4's
        one global scale: see stack_nvfp4)."""
        natives = [self.native(name) for name in names]
        first = natives[0]
        if first is None or first.blobs is None:
            return first
        nvfp4 = first.encoding == "nvfp4"

        def blobs() -> dict[str, np.ndarray]:
            experts = [native.blobs() for native in natives]
            if nvfp4:
                return stack_nvfp4(experts)
            return {key: np.stack([expert[key] for expert in experts]) for key in experts[0]}

        # nvfp4 experts with different global scales are re-rounded: measured, never assumed exact.
        exact = first.exact and not nvfp4 and all(native.exact for native in natives)
        return NativeTensor(first.encoding, blobs, exact=exact, group_size=first.group_size)

    def stacked_loader(self, names: list[str]) -> Callable[[], np.ndarray]:
        """A function reading tensors `names` (same shape) as one float32 array with a new leading axis."""
        loaders = [self.loader(name) for name in names]
        return lambda: np.stack([load() for load in loaders])

    def loader(self, name: str, transform: Callable[[np.ndarray], np.ndarray] | None = None,
               rows: slice | None = None) -> Callable[[], np.ndarray]:
        """A function reading tensor `name` (optionally only `rows` of its second axis) as float32."""
        import torch

        scale = self.scale_of.get(name)

        def load() -> np.ndarray:
            if name in self.quantized:
                values = self.quantized[name].dequantized()
                values = values[:, rows] if rows is not None else values
                return transform(values) if transform is not None else values
            with self._safe_open(self.file_of[name], framework="pt") as f:
                if scale is not None:  # the block scales apply to the whole tensor: scale first, then slice
                    tensor = _fp8_dequantize(f.get_tensor(name), self._read(scale), self.block_size)
                    tensor = tensor[:, rows] if rows is not None else tensor
                else:
                    tensor = f.get_slice(name)[:, rows] if rows is not None else f.get_tensor(name)
            values = tensor.to(torch.float32).numpy()
            return transform(values) if transform is not None else values

        return load


    def _read(self, name: str):
        with self._safe_open(self.file_of[name], framework="pt") as f:
            return f.get_tensor(name)


FP8_SCALE_SUFFIX = "_scale_inv"  # `X.weight_scale_inv` scales `X.weight` (the official Qwen FP8 layout)


def fp8_block_scales(shapes: dict[str, tuple[int, ...]], block: tuple[int, int], folder: Path) -> dict[str, str]:
    """FP8 weight -> its scale tensor, checking that each scale has one entry per block of the weight's last two
    axes: `weight = e4m3 * weight_scale_inv[row // block[0], col // block[1]]`, the last blocks possibly partial."""
    pairs = {}
    for name, shape in shapes.items():
        if not name.endswith(".weight" + FP8_SCALE_SUFFIX):
            continue
        weight = name[: -len(FP8_SCALE_SUFFIX)]
        if weight not in shapes:
            raise ConversionError(f"{folder}: {name} scales no tensor ({weight} is not in the checkpoint)")
        rows, cols = shapes[weight][-2:]
        expected = (*shapes[weight][:-2], -(-rows // block[0]), -(-cols // block[1]))
        if tuple(shape) != expected:
            raise ConversionError(f"{folder}: {name} has shape {list(shape)}; {block[0]}x{block[1]} blocks of "
                                  f"{weight} {list(shapes[weight])} need {list(expected)}")
        pairs[weight] = name
    return pairs


def _fp8_dequantize(weight, scale, block: tuple[int, int]):
    """e4m3 values times their block's scale, in float32 (the product of a 4-bit and a 24-bit significand, rounded
    once to f32: the checkpoint's weights as its own dequantization defines them)."""
    import torch

    rows, cols = weight.shape[-2:]
    expanded = scale.to(torch.float32).repeat_interleave(block[0], -2).repeat_interleave(block[1], -1)
    return weight.to(torch.float32) * expanded[..., :rows, :cols]


def _safetensors_files(folder: Path) -> list[Path]:
    """The shards the index names when there is one (a folder may hold other .safetensors, e.g. a consolidated
    copy), else every *.safetensors file."""
    index = _read_json(folder / _INDEX_FILE)
    if index is None:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ConversionError(f"{folder}: no *.safetensors files (a Hugging Face model folder has them)")
        return files
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ConversionError(f"{folder / _INDEX_FILE}: no weight_map")
    files = [folder / name for name in sorted(set(map(str, weight_map.values())))]
    missing = [file.name for file in files if not file.is_file()]
    if missing:
        raise ConversionError(f"{folder}: {_INDEX_FILE} names shards that are not there: {', '.join(missing)}")
    return files


def _check_index(index: _SafetensorsIndex, folder: Path) -> None:
    """The index and the shards must agree tensor by tensor: a stale index would silently drop or misplace one."""
    listed = _read_json(folder / _INDEX_FILE)
    if listed is None:
        return
    weight_map = {str(k): folder / str(v) for k, v in listed["weight_map"].items()}
    stored = index.stored
    wrong = sorted(name for name in weight_map.keys() | stored if weight_map.get(name) != index.file_of.get(name))
    if wrong:
        raise ConversionError(f"{folder}: {_INDEX_FILE} disagrees with the shards about {len(wrong)} tensors, e.g. "
                              f"{', '.join(wrong[:3])}")


def _split_layer(name: str) -> tuple[int, str] | None:
    match = _LAYER.fullmatch(name)
    return (int(match.group(1)), match.group(2)) if match else None


def _layer_tensors(index: _SafetensorsIndex, ckpt: str, prefix: str, rest: str) -> list[SourceTensor]:
    shape = index.shape_of[ckpt]
    if rest == _FUSED_EXPERTS:
        if ckpt in index.quantized:  # splitting its rows would lose the codes: they would be re-quantised
            raise ConversionError(f"{ckpt}: fused pack-quantized experts are not supported (per-expert ones are)")
        half = shape[1] // 2
        return [
            SourceTensor(f"{prefix}moe.experts_gate", (shape[0], half, shape[2]),
                         index.loader(ckpt, rows=slice(0, half))),
            SourceTensor(f"{prefix}moe.experts_up", (shape[0], half, shape[2]),
                         index.loader(ckpt, rows=slice(half, 2 * half))),
        ]
    logical = _LAYER_NAMES.get(rest)
    if logical is None:
        return []
    if logical == "gdn.conv":
        channels, kernel = shape[0], shape[-1]
        return [SourceTensor(prefix + logical, (channels, kernel),
                             index.loader(ckpt, lambda a: a.reshape(channels, kernel)))]
    return [SourceTensor(prefix + logical, shape, index.loader(ckpt), index.native(ckpt))]


def _layer_of(ckpt: str, text_prefix: str) -> tuple[str, str] | None:
    """(logical layer prefix, name within the layer) of a decoder or MTP layer tensor."""
    if ckpt.startswith("mtp."):
        layer, prefix = _split_layer(ckpt[len("mtp."):]), "mtp.layers."
    elif ckpt.startswith(text_prefix):
        layer, prefix = _split_layer(ckpt[len(text_prefix):]), "layers."
    else:
        return None
    return (f"{prefix}{layer[0]}.", layer[1]) if layer else None


def _map_tensor(index: _SafetensorsIndex, ckpt: str, text_prefix: str) -> list[SourceTensor]:
    """The logical tensor(s) of one checkpoint tensor; [] when the name is not one the converter knows."""
    if ckpt == "lm_head.weight":
        return [SourceTensor("lm_head", index.shape_of[ckpt], index.loader(ckpt), index.native(ckpt))]
    if ckpt.startswith("model.visual."):
        return [SourceTensor("visual." + ckpt[len("model.visual."):], index.shape_of[ckpt], index.loader(ckpt))]
    if ckpt.startswith("mtp.") and ckpt[len("mtp."):] in _MTP_TOP_NAMES:
        return [SourceTensor(_MTP_TOP_NAMES[ckpt[len("mtp."):]], index.shape_of[ckpt], index.loader(ckpt))]
    if ckpt.startswith(text_prefix) and ckpt[len(text_prefix):] in _TOP_NAMES:
        return [SourceTensor(_TOP_NAMES[ckpt[len(text_prefix):]], index.shape_of[ckpt], index.loader(ckpt))]
    layer = _layer_of(ckpt, text_prefix)
    return _layer_tensors(index, ckpt, *layer) if layer else []


def _stack_per_expert(index: _SafetensorsIndex, folder: Path, text_prefix: str) -> tuple[list[SourceTensor], set[str]]:
    """The logical `moe.experts_{gate,up,down}` [E, ...] of checkpoints that store one tensor per expert, and the
    checkpoint names they consumed."""
    groups: dict[tuple[str, str], dict[int, str]] = {}
    for ckpt in index.file_of:
        layer = _layer_of(ckpt, text_prefix)
        match = _PER_EXPERT.fullmatch(layer[1]) if layer else None
        if match:
            groups.setdefault((layer[0], match.group(2)), {})[int(match.group(1))] = ckpt
    tensors = []
    for (prefix, projection), experts in sorted(groups.items()):
        if sorted(experts) != list(range(len(experts))):
            missing = sorted(set(range(max(experts) + 1)) - experts.keys())
            raise ConversionError(f"{folder}: {prefix}{projection}: experts {missing} missing from the checkpoint")
        names = [experts[e] for e in range(len(experts))]
        shapes = {index.shape_of[name] for name in names}
        if len(shapes) != 1:
            raise ConversionError(f"{folder}: {prefix}{projection}: experts of different shapes {sorted(shapes)}")
        tensors.append(SourceTensor(f"{prefix}moe.experts_{projection}", (len(names), *shapes.pop()),
                                    index.stacked_loader(names), index.stacked_native(names)))
    return tensors, {name for experts in groups.values() for name in experts.values()}


def _map_all(index: _SafetensorsIndex, folder: Path, text_prefix: str) -> list[SourceTensor]:
    tensors, consumed = _stack_per_expert(index, folder, text_prefix)
    unknown = []
    consumed |= index.auxiliary
    for ckpt in index.file_of:
        if ckpt in consumed:
            continue
        mapped = _map_tensor(index, ckpt, text_prefix)
        if mapped:
            tensors.extend(mapped)
        elif not _IGNORED.fullmatch(ckpt):
            unknown.append(ckpt)
    if unknown:
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise ConversionError(f"{folder}: tensors this converter does not know: {', '.join(unknown[:5])}{more}")
    return tensors


def _rope(text: dict, path: Path, head_dim: int, default_partial: float, mrope: bool) -> dict:
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConversionError(f"{path}: RoPE type {rope_type!r} is not supported yet (only 'default')")
    # HF's generic default theta when a config gives none.
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", text.get("partial_rotary_factor", default_partial))
    return {"theta": float(theta), "rotary_dim": int(head_dim * partial), "pairing": "half",
            "mrope_section": list(params["mrope_section"]) if mrope and params.get("mrope_section") else None}


# HF Qwen3_5VisionConfig defaults (architecture reference §1.5) for fields a checkpoint's vision_config leaves out.
_VISION_DEFAULTS = {"depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304,
                    "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
                    "temporal_patch_size": 2, "out_hidden_size": 3584, "num_position_embeddings": 2304}
# The placeholder and marker token ids (HF Qwen3_5Config defaults).
_VISION_TOKEN_DEFAULTS = {"image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
                          "vision_end_token_id": 248054}


def _vision_config(config: dict, tensors: list[SourceTensor], path: Path) -> dict | None:
    """The vision tower's config when the checkpoint carries the tower (`visual.*`), else None."""
    if not any(t.name.startswith("visual.") for t in tensors):
        return None
    vision = config.get("vision_config") or {}
    out = {key: vision.get(key, default) for key, default in _VISION_DEFAULTS.items()}
    if vision.get("deepstack_visual_indexes"):
        raise ConversionError(f"{path}: vision_config.deepstack_visual_indexes is set; Qwen3.5 towers have no "
                              "DeepStack and this converter does not carry it")
    if out["hidden_act"] != "gelu_pytorch_tanh":
        raise ConversionError(f"{path}: vision hidden_act {out['hidden_act']!r} is not supported "
                              "(only gelu_pytorch_tanh)")
    rope = vision.get("rope_parameters") or {}
    out["rope_theta"] = float(rope.get("rope_theta", vision.get("rope_theta", 10000.0)))
    out.update({key: int(config.get(key, default)) for key, default in _VISION_TOKEN_DEFAULTS.items()})
    return out


def _as_list(value: object) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _mtp_layers(tensors: list[SourceTensor]) -> int:
    return len({t.name.split(".")[2] for t in tensors if t.name.startswith("mtp.layers.")})


def _qwen35_config(arch: str, text: dict, tie: bool, tensors: list[SourceTensor], path: Path) -> dict:
    num_layers = int(text["num_hidden_layers"])
    interval = int(text.get("full_attention_interval", 4))
    layer_types = text.get("layer_types") or [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)
    ]
    head_dim = int(text.get("head_dim", 256))
    moe = None
    if arch == "qwen3_5_moe":
        moe = {"num_experts": int(text["num_experts"]), "top_k": int(text["num_experts_per_tok"]),
               "intermediate_size": int(text["moe_intermediate_size"]),
               "shared_intermediate_size": int(text["shared_expert_intermediate_size"])}
    mtp_layers = _mtp_layers(tensors)
    return decoder_config(
        arch=arch,
        vocab_size=int(text["vocab_size"]),
        hidden_size=int(text["hidden_size"]),
        num_layers=num_layers,
        layer_types=list(layer_types),
        num_heads=int(text["num_attention_heads"]),
        num_kv_heads=int(text["num_key_value_heads"]),
        head_dim=head_dim,
        intermediate_size=int(text["intermediate_size"]) if moe is None else None,
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        norm_offset=True,
        attn_output_gate=True,
        qk_norm=True,
        qkv_bias=False,
        rope=_rope(text, path, head_dim, 0.25, mrope=True),
        tie_word_embeddings=tie,
        max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
        linear_attention={
            "num_key_heads": int(text["linear_num_key_heads"]),
            "num_value_heads": int(text["linear_num_value_heads"]),
            "key_head_dim": int(text["linear_key_head_dim"]),
            "value_head_dim": int(text["linear_value_head_dim"]),
            "conv_kernel": int(text.get("linear_conv_kernel_dim", 4)),
        },
        moe=moe,
        mtp={"num_layers": mtp_layers} if mtp_layers else None,
    )


def _plain_config(arch: str, text: dict, tie: bool, tensors: list[SourceTensor], path: Path) -> dict:
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    num_layers = int(text["num_hidden_layers"])
    names = {t.name for t in tensors}
    return decoder_config(
        arch=arch,
        vocab_size=int(text["vocab_size"]),
        hidden_size=int(text["hidden_size"]),
        num_layers=num_layers,
        layer_types=["full_attention"] * num_layers,
        num_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        intermediate_size=int(text["intermediate_size"]),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        qk_norm="layers.0.attn.q_norm" in names,
        qkv_bias="layers.0.attn.q_bias" in names,
        rope=_rope(text, path, head_dim, 1.0, mrope=False),
        tie_word_embeddings=tie,
        max_position_embeddings=int(text.get("max_position_embeddings", 4096)),
    )


def _chat_template(folder: Path) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = (_read_json(folder / "tokenizer_config.json") or {}).get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _quantization_config(config: dict, folder: Path) -> dict | None:
    """The checkpoint's quantization config: config.json's quantization_config (top level or the VLM's
    text_config), else what older checkpoints keep beside it: GPTQ's quantize_config.json, ModelOpt's
    hf_quant_config.json."""
    quantization = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    if quantization:
        return quantization
    gptq = _read_json(folder / "quantize_config.json")
    if gptq is not None:
        return {"quant_method": "gptq", **gptq}
    return _read_json(folder / "hf_quant_config.json")


def _quantization(config: dict, folder: Path) -> tuple[tuple[int, int] | None, QuantizedLayout | None]:
    """(rows, cols) of a block-wise FP8 checkpoint's scale blocks, and the layout of any other pre-quantised one
    (compressed-tensors int4 pack-quantized or NVFP4, GPTQ, AWQ, ModelOpt NVFP4); (None, None) for an unquantised
    checkpoint. Other pre-quantised formats are refused by name (their packed tensors would otherwise read as
    unknown names)."""
    quantization = _quantization_config(config, folder)
    if not quantization:
        return None, None
    method = quantization.get("quant_method")
    if method == "fp8" and quantization.get("fmt", "e4m3") == "e4m3" and quantization.get("weight_block_size"):
        block = quantization["weight_block_size"]
        if len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
            return (int(block[0]), int(block[1])), None
    if method == "compressed-tensors":
        groups = (quantization.get("config_groups") or {}).values()
        formats = {group.get("format") or quantization.get("format") for group in groups}
        if formats == {COMPRESSED_NVFP4_FORMAT}:
            return None, compressed_nvfp4_layout(quantization, folder)
        return None, packed_int4_scheme(quantization, folder)
    if method in ("gptq", "awq"):
        return None, gptq_layout(quantization, folder)
    # ModelOpt: a flat config (quant_method "modelopt") or its export's {"producer", "quantization"} sections.
    if method == "modelopt" or (quantization.get("producer") or {}).get("name") == "modelopt":
        return None, modelopt_layout(quantization.get("quantization") or quantization, folder)
    raise ConversionError(f"{folder}: pre-quantised checkpoints with quantization_config {json.dumps(quantization)} "
                          "are not supported (block-wise FP8 e4m3 with weight_block_size; compressed-tensors int4 "
                          "pack-quantized and nvfp4-pack-quantized; GPTQ and AWQ int4; ModelOpt NVFP4 are)")


def open_hf_folder(folder: Path) -> Source:
    config = _read_json(folder / "config.json")
    if config is None:
        raise ConversionError(f"{folder}: no config.json (expected a Hugging Face model folder)")
    model_type = str(config.get("model_type", "<missing model_type>"))
    if model_type in QWEN35_FAMILY:
        arch, text, text_prefix = model_type, config.get("text_config") or {}, "model.language_model."
    elif model_type in _QWEN35_TEXT_TYPES:
        arch, text, text_prefix = _QWEN35_TEXT_TYPES[model_type], config, "model."
    elif model_type in PLAIN_DECODERS:
        arch, text, text_prefix = model_type, config, "model."
    else:
        raise unsupported_architecture(folder, "model_type", model_type)

    index = _SafetensorsIndex(folder, *_quantization(config, folder))
    _check_index(index, folder)
    tensors = _map_all(index, folder, text_prefix)
    tie = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    tie = tie or "lm_head.weight" not in index.file_of
    if tie:  # a tied head is the embedding; a copy in the checkpoint would only waste space
        tensors = [t for t in tensors if t.name != "lm_head"]
    try:
        build = _qwen35_config if arch in QWEN35_FAMILY else _plain_config
        normalised = build(arch, text, tie, tensors, folder)
    except KeyError as exc:
        raise ConversionError(f"{folder}/config.json: missing field {exc.args[0]!r} for {arch}") from exc

    generation = _read_json(folder / "generation_config.json") or {}
    eos = _as_list(generation.get("eos_token_id", text.get("eos_token_id")))
    pad = generation.get("pad_token_id", text.get("pad_token_id"))
    bos = text.get("bos_token_id")
    if arch in QWEN35_FAMILY:
        # The Qwen3.5 tokenizer adds no BOS; a chat turn ends at <|im_end|> whatever the config lists.
        bos, pad = None, QWEN35_PAD if pad is None else pad
        eos = list(QWEN35_EOS) + [e for e in eos if e not in QWEN35_EOS]
    normalised.update(bos_token_id=bos, eos_token_ids=eos)
    if arch in QWEN35_FAMILY:
        normalised["vision"] = _vision_config(config, tensors, folder)

    preprocessing = {}
    for key, filename in (("image", "preprocessor_config.json"), ("video", "video_preprocessor_config.json")):
        value = _read_json(folder / filename)
        if value is not None:
            preprocessing[key] = value
    tokenizer = folder / "tokenizer.json"
    return Source(
        kind="hf",
        path=folder.resolve(),
        architecture=model_type,
        config=normalised,
        tensors=tensors,
        tokenizer_json=tokenizer.read_text(encoding="utf-8") if tokenizer.is_file() else None,
        chat_template=_chat_template(folder),
        generation_defaults=hf_sampling_defaults(generation, f"{folder}/generation_config.json"),
        preprocessing=preprocessing,
        special_tokens={"bos": bos, "eos": eos, "pad": pad},
    )
