"""Synthetic `.ninfer` artifacts at the real Qwen3.5 shapes, written directly in their serving encoding: random
codes with sane scales (so activations stay finite), never a bf16 checkpoint. Speed does not depend on the values.

    python bench/synthetic.py --model qwen3.5-27b --recipe groupwise-int --out /tmp/27b.ninfer
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from ninfer.artifact.draft_vocab import draft_vocab_ids
from ninfer.artifact.encodings import blob_specs
from ninfer.artifact.recipes import load_recipe
from ninfer.artifact.writer import ArtifactWriter, TensorPlan

VOCAB = 248320


def _config(hidden: int, layers: int, heads: int, kv_heads: int, key_heads: int, value_heads: int,
            intermediate: int | None, moe: dict | None) -> dict:
    return {
        "arch": "qwen3_5_moe" if moe else "qwen3_5", "vocab_size": VOCAB, "hidden_size": hidden,
        "num_layers": layers,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": 256, "intermediate_size": intermediate,
        "rms_norm_eps": 1e-6, "norm_offset": True, "attn_output_gate": True, "qk_norm": True, "qkv_bias": False,
        "rope": {"theta": 1e7, "rotary_dim": 64, "pairing": "half", "mrope_section": [11, 11, 10]},
        "tie_word_embeddings": False, "max_position_embeddings": 262144,
        "linear_attention": {"num_key_heads": key_heads, "num_value_heads": value_heads, "key_head_dim": 128,
                             "value_head_dim": 128, "conv_kernel": 4},
        "moe": moe, "mtp": None, "bos_token_id": None, "eos_token_ids": [248046, 248044],
    }


# Published shapes (reference section 9).
MODELS = {
    "qwen3.5-27b": _config(5120, 64, 24, 4, 16, 48, 17408, None),
    "qwen3.5-35b-a3b": _config(2048, 40, 16, 2, 16, 32, None,
                               {"num_experts": 256, "top_k": 8, "intermediate_size": 512,
                                "shared_intermediate_size": 512}),
    # Not published: a small text model in the same layout, for CPU figures (bench/vision_tower.py's tiny tower).
    "tiny": _config(64, 4, 4, 2, 2, 4, 128, None),
}


def with_mtp(config: dict) -> dict:
    """The config with the MTP head every released Qwen3.5 checkpoint carries (one decoder layer)."""
    return config | {"mtp": {"num_layers": 1}}


# The released vision tower (reference section 1.5; its out_hidden_size is the text model's hidden size) and the
# tiny one of tests/tiny_models.py, for CPU figures. Token ids are the real tokenizer's.
VISION_TOWERS = {
    "released": {"depth": 27, "hidden_size": 1152, "num_heads": 16, "intermediate_size": 4304, "in_channels": 3,
                 "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
                 "num_position_embeddings": 2304},
    "tiny": {"depth": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32, "in_channels": 3,
             "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 16},
}
VISION_TOKEN_IDS = {"vision_start_token_id": 248053, "vision_end_token_id": 248054, "image_token_id": 248056,
                    "video_token_id": 248057}


def with_vision(config: dict, tower: str) -> dict:
    """The text config plus the named vision tower, projecting into the text model's width."""
    vision = VISION_TOWERS[tower] | VISION_TOKEN_IDS | {"out_hidden_size": config["hidden_size"],
                                                        "hidden_act": "gelu_pytorch_tanh", "rope_theta": 10000.0}
    return config | {"vision": vision}


def with_layers(config: dict, layers: int) -> dict:
    """The config cut to its first `layers` layers (a multiple of 4 keeps the linear / full pattern)."""
    return config | {"num_layers": layers, "layer_types": config["layer_types"][:layers]}


def vision_tensor_shapes(vision: dict) -> dict[str, tuple[int, ...]]:
    d, inner, merged = vision["hidden_size"], vision["intermediate_size"], 4 * vision["hidden_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "visual.patch_embed.proj.weight": (d, vision["in_channels"], vision["temporal_patch_size"],
                                           vision["patch_size"], vision["patch_size"]),
        "visual.patch_embed.proj.bias": (d,), "visual.pos_embed.weight": (vision["num_position_embeddings"], d),
        "visual.merger.norm.weight": (d,), "visual.merger.norm.bias": (d,),
        "visual.merger.linear_fc1.weight": (merged, merged), "visual.merger.linear_fc1.bias": (merged,),
        "visual.merger.linear_fc2.weight": (vision["out_hidden_size"], merged),
        "visual.merger.linear_fc2.bias": (vision["out_hidden_size"],),
    }
    for i in range(vision["depth"]):
        p = f"visual.blocks.{i}."
        shapes |= {p + "norm1.weight": (d,), p + "norm1.bias": (d,), p + "norm2.weight": (d,), p + "norm2.bias": (d,),
                   p + "attn.qkv.weight": (3 * d, d), p + "attn.qkv.bias": (3 * d,), p + "attn.proj.weight": (d, d),
                   p + "attn.proj.bias": (d,), p + "mlp.linear_fc1.weight": (inner, d),
                   p + "mlp.linear_fc1.bias": (inner,), p + "mlp.linear_fc2.weight": (d, inner),
                   p + "mlp.linear_fc2.bias": (d,)}
    return shapes


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every logical tensor the engine needs (docs/artifact-format.md) with its shape."""
    h, v = config["hidden_size"], config["vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {"embed": (v, h), "lm_head": (v, h), "final_norm": (h,)}
    for i, kind in enumerate(config["layer_types"]):
        shapes |= _layer_shapes(config, f"layers.{i}.", kind)
    if config.get("mtp"):
        shapes |= {"mtp.fc": (h, 2 * h), "mtp.pre_fc_norm_embedding": (h,), "mtp.pre_fc_norm_hidden": (h,),
                   "mtp.norm": (h,)} | _layer_shapes(config, "mtp.layers.0.", "full_attention")
    if config.get("vision"):
        shapes |= vision_tensor_shapes(config["vision"])
    return shapes


def _layer_shapes(config: dict, p: str, kind: str) -> dict[str, tuple[int, ...]]:
    h = config["hidden_size"]
    la = config["linear_attention"]
    kd, vd = la["num_key_heads"] * 128, la["num_value_heads"] * 128
    q_rows = config["num_heads"] * 256 * 2
    kv_rows = config["num_kv_heads"] * 256
    shapes: dict[str, tuple[int, ...]] = {p + "input_norm": (h,), p + "post_attn_norm": (h,)}
    if kind == "full_attention":
        shapes |= {p + "attn.q_proj": (q_rows, h), p + "attn.k_proj": (kv_rows, h), p + "attn.v_proj": (kv_rows, h),
                   p + "attn.o_proj": (h, q_rows // 2), p + "attn.q_norm": (256,), p + "attn.k_norm": (256,)}
    else:
        shapes |= {p + "gdn.in_qkv": (2 * kd + vd, h), p + "gdn.in_z": (vd, h),
                   p + "gdn.in_b": (la["num_value_heads"], h), p + "gdn.in_a": (la["num_value_heads"], h),
                   p + "gdn.conv": (2 * kd + vd, 4), p + "gdn.A_log": (la["num_value_heads"],),
                   p + "gdn.dt_bias": (la["num_value_heads"],), p + "gdn.norm": (128,),
                   p + "gdn.out_proj": (h, vd)}
    if config["moe"]:
        m = config["moe"]
        e, inter, shared = m["num_experts"], m["intermediate_size"], m["shared_intermediate_size"]
        shapes |= {p + "moe.router": (e, h), p + "moe.experts_gate": (e, inter, h),
                   p + "moe.experts_up": (e, inter, h), p + "moe.experts_down": (e, h, inter),
                   p + "moe.shared_gate": (shared, h), p + "moe.shared_up": (shared, h),
                   p + "moe.shared_down": (h, shared), p + "moe.shared_expert_gate": (1, h)}
    else:
        inter = config["intermediate_size"]
        shapes |= {p + "mlp.gate": (inter, h), p + "mlp.up": (inter, h), p + "mlp.down": (h, inter)}
    return shapes


def synthetic_blobs(rng: np.random.Generator, encoding: str, shape: tuple[int, ...],
                    group: int | None) -> dict[str, np.ndarray]:
    """Random codes whose decoded values are small (|w| ~ 1e-2), so a forward pass stays finite."""
    blobs = {}
    for name, spec in blob_specs(encoding, shape, group).items():
        if name in ("q", "data") and spec.dtype == np.uint8:
            codes = rng.integers(0, 256, spec.shape, dtype=np.uint8)
            if encoding in ("fp8_e4m3", "nvfp4"):
                codes &= 0x77 if encoding == "nvfp4" else 0xBF  # no NaN codes; moderate magnitudes
            blobs[name] = codes
        elif name == "data":  # bf16 / f16 / f32 values around 1e-2
            values = (rng.standard_normal(spec.shape, dtype=np.float32) * 0.02).astype(np.float32)
            blobs[name] = (values.view(np.uint32) >> 16).astype(np.uint16) if spec.dtype == np.uint16 \
                else values.astype(spec.dtype)
        elif name == "scale":
            blobs[name] = (np.full(spec.shape, 0x30, np.uint8) if spec.dtype == np.uint8  # e4m3 0.125
                           else np.full(spec.shape, 2e-3 if spec.dtype == np.float16 else 1e-2, spec.dtype))
        elif name == "zero":
            blobs[name] = np.full(spec.shape, 8 if encoding == "int4" else 128, np.uint8)
        else:  # nvfp4 global scale
            blobs[name] = np.full(spec.shape, 0.05, spec.dtype)
    return blobs


def control_values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Plausible values for the 1-D control tensors (norms, gates, conv taps)."""
    if name.endswith("A_log"):
        return np.log(rng.uniform(1, 16, shape)).astype(np.float32)
    if name.endswith(("gdn.norm",)):
        return np.ones(shape, np.float32)
    return (rng.standard_normal(shape) * 0.05).astype(np.float32)


def write_synthetic(model: str, recipe_name: str, out: Path, progress: bool = True,
                    config: dict | None = None, mtp: bool = False, draft_vocab: int | None = None) -> Path:
    """`model`'s artifact (`config`: a variant of MODELS[model], e.g. with_vision / with_layers of it); with `mtp`,
    its MTP head too (with_mtp); with `draft_vocab`, the drafts' shortlist of that many rows (its own random rows,
    the ids `ninfer convert --draft-vocab` would keep)."""
    config = config or MODELS[model]
    if mtp:
        config = with_mtp(config)
    recipe = load_recipe(recipe_name)
    shapes = tensor_shapes(config)
    draft_ids = None
    if draft_vocab:
        draft_ids = draft_vocab_ids(config["vocab_size"], config["eos_token_ids"], draft_vocab).astype(np.float32)
        shapes |= {"mtp.draft_vocab": (draft_vocab,), "mtp.draft_head": (draft_vocab, config["hidden_size"])}
    plans = [TensorPlan(name, shape, *recipe.plan(name, shape)) for name, shape in shapes.items()]
    rng = np.random.default_rng(0)
    frontend = {"tokenizer_json": None, "chat_templates": {}, "generation_defaults": {}, "preprocessing": {},
                "special_tokens": {"bos": None, "eos": config["eos_token_ids"], "pad": None}}
    with ArtifactWriter(out, config=config, tensors=plans, frontend=frontend, recipe=recipe.to_json(),
                        source={"kind": "synthetic", "path": "", "architecture": model}, progress=progress) as w:
        for plan in plans:
            if plan.name == "mtp.draft_vocab":
                w.write(plan.name, draft_ids)
            elif plan.encoding == "f32" and len(plan.shape) == 1 or plan.name.endswith("gdn.conv"):
                w.write(plan.name, control_values(plan.name, plan.shape, rng))
            else:
                w.write_encoded(plan.name, synthetic_blobs(rng, plan.encoding, plan.shape, plan.group_size))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--recipe", default="groupwise-int")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    write_synthetic(args.model, args.recipe, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
