"""Tiny random Hugging Face checkpoints, built from a seed, for converter and engine parity tests.

API (other test modules use only these):

    build_tiny_checkpoint(kind, root, seed=0) -> Path
        A folder with config.json, model.safetensors and (Qwen3.5 kinds) generation_config.json and
        preprocessor_config.json, built once under `root` and reused (keyed by kind, seed and BUILDER_VERSION).
        kind is one of TINY_KINDS: "qwen3_5", "qwen3_5_moe", "llama", "qwen2", "qwen3".
    load_reference_model(path) -> transformers PreTrainedModel (fp32, eval mode)
        The HF causal-LM for the checkpoint (Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM for the Qwen3.5 kinds,
        text weights only), loaded with exactly the checkpoint's values.
    load_reference_mtp(path, model) -> transformers MtpModel (fp32, eval mode)
        HF's generic MTP head for a Qwen3.5 checkpoint, sharing embeddings and lm_head with `model`.
    build_saved_checkpoint(kind, root, seed=0) -> Path
        Built once under `root` like build_tiny_checkpoint: a Qwen3.5 kind in the layout the published checkpoints use, written by transformers' own save_pretrained:
        Qwen3_5(Moe)ForConditionalGeneration (text + vision) in bf16 shards with model.safetensors.index.json,
        routed experts one tensor per expert (`mlp.experts.N.gate_proj.weight`, ...), plus the MTP layer (which
        transformers' class does not hold) in one more shard listed in the index. Same configs as above.
    load_saved_reference(path) -> transformers Qwen3_5(Moe)ForConditionalGeneration (fp32, eval mode)
        HF's from_pretrained of such a folder: HF's own loader, not ours, reads the saved layout back.

What the checkpoints look like and why:
- Qwen3.5 kinds use the real VLM layout: `model.language_model.*`, `lm_head.weight`, `mtp.*` and a tiny
  `model.visual.*` tower, with a top-level `Qwen3_5Config` (text_config + vision_config) like released models.
  The vocabulary is the real 248,320 rows, so the real 248k tokenizer's ids are all valid.
- 8 decoder layers, L,L,L,F,L,L,L,F; GDN with Hv = 2*Hk and Dv != Dk; partial M-RoPE with theta set explicitly.
- Random init leaves zero-centred norms at 0, the GDN norm at 1 and A_log/dt_bias at their init; all of these are
  redrawn so that every convention (1+w vs w, exp(A_log), softplus(a + dt_bias)) changes the output.
- Every weight is rounded to a bf16-representable value, so a bf16 artifact holds exactly the reference weights.
  Tensors are stored as bf16 (llama as fp32, to exercise an fp32 source).
- The plain kinds are written by transformers' save_pretrained (the layout published checkpoints have); the Qwen3.5
  kinds here are written tensor by tensor in the VLM layout with fused experts (transformers' in-memory layout,
  which the converter also reads), and build_saved_checkpoint gives them as save_pretrained writes them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

TINY_KINDS = ("qwen3_5", "qwen3_5_moe", "llama", "qwen2", "qwen3")
# Bump when the builder changes what it writes, so cached checkpoints are rebuilt.
BUILDER_VERSION = 3

QWEN35_VOCAB = 248320
QWEN35_TEXT_PREFIX = "model.language_model."
PLAIN_VOCAB = 512

# MtpModel parameter names -> Qwen3.5 checkpoint names (architecture reference, section 6.1).
_MTP_RENAMES = (
    ("layers.0.enorm.", "pre_fc_norm_embedding."),
    ("layers.0.hnorm.", "pre_fc_norm_hidden."),
    ("layers.0.eh_proj.", "fc."),
    ("layers.0.post_norm.", "norm."),
    ("layers.0.mtp_block.", "layers.0."),
)


def _qwen35_text_config(kind: str) -> dict:
    common = dict(
        vocab_size=QWEN35_VOCAB,
        hidden_size=64,
        num_hidden_layers=8,
        layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=24,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        initializer_range=0.05,
        tie_word_embeddings=False,
        rope_parameters=dict(
            rope_type="default",
            rope_theta=1e7,
            partial_rotary_factor=0.25,
            mrope_section=[2, 1, 1],
            mrope_interleaved=True,
        ),
        mtp_num_hidden_layers=1,
        bos_token_id=248044,
        eos_token_id=248044,
    )
    if kind == "qwen3_5":
        return dict(common, model_type="qwen3_5_text", intermediate_size=128)
    return dict(
        common,
        model_type="qwen3_5_moe_text",
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
    )


_VISION_CONFIG = dict(
    depth=1,
    hidden_size=16,
    num_heads=2,
    intermediate_size=32,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=64,
    num_position_embeddings=16,
)


def _plain_config(kind: str) -> dict:
    common = dict(
        vocab_size=PLAIN_VOCAB,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        rms_norm_eps=1e-5,
        max_position_embeddings=2048,
        initializer_range=0.05,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        bos_token_id=1,
        eos_token_id=2,
    )
    if kind == "llama":
        return dict(common, model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=False)
    if kind == "qwen2":  # tied head, qkv bias (always on in Qwen2)
        return dict(common, model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True)
    # qwen3: q/k norm, head_dim != hidden/heads
    return dict(
        common, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=32, tie_word_embeddings=False
    )


def _text_config_object(kind: str, text: dict):
    """The transformers config for the causal LM (text part only)."""
    from transformers import AutoConfig

    fields = {k: v for k, v in text.items() if k != "model_type"}
    if kind in ("qwen3_5", "qwen3_5_moe"):
        # HF's generic MtpModel reads these two (section 11); real checkpoints say mtp_num_hidden_layers.
        fields.update(num_mtp_layers=1, mtp_layer_types=["full_attention"])
    return AutoConfig.for_model(text["model_type"], **fields)


def _causal_lm_class(kind: str):
    import transformers

    return {
        "qwen3_5": transformers.Qwen3_5ForCausalLM,
        "qwen3_5_moe": transformers.Qwen3_5MoeForCausalLM,
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
    }[kind]


def _perturb(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Redraw norm weights and GDN gate parameters away from their init, then round every weight to bf16."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("A_log"):
                param.copy_(torch.empty_like(param).uniform_(-1.0, 1.5, generator=generator))
            elif name.endswith("dt_bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
            elif "norm" in name and not name.endswith(".bias"):
                # Zero-centred (1 + w) norms sit at 0 and plain norms at 1 after init; shift both by noise.
                param.add_(torch.randn(param.shape, generator=generator) * 0.15)
            elif name.endswith(".bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
            param.copy_(param.to(torch.bfloat16).to(torch.float32))


def _initialise_mtp(mtp: torch.nn.Module, generator: torch.Generator) -> None:
    """MtpModel is no PreTrainedModel: nothing initialises its own parameters, which keep whatever memory they were
    given (a fresh environment once produced NaN experts). Draw them from the seed: matrices N(0, 0.05^2), the
    zero-centred norms 0 (then perturbed like every norm)."""
    with torch.no_grad():
        for name, param in mtp.named_parameters():
            if name in ("embed_tokens.weight", "shared_head.weight"):  # the main model's, already initialised
                continue
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
            else:
                param.zero_()


def _mtp_checkpoint_name(mtp_key: str) -> str:
    for old, new in _MTP_RENAMES:
        if mtp_key.startswith(old):
            return "mtp." + new + mtp_key[len(old) :]
    raise KeyError(f"unexpected MtpModel parameter {mtp_key}")


def _build_qwen35(kind: str, folder: Path, seed: int) -> None:
    from transformers.modeling_layers import MtpModel
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    text = _qwen35_text_config(kind)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = _causal_lm_class(kind)(_text_config_object(kind, text))
    mtp = MtpModel(model, 1)
    _initialise_mtp(mtp, generator)
    vision = Qwen3_5VisionModel(Qwen3_5VisionConfig(**_VISION_CONFIG))
    for module in (model, mtp, vision):
        _perturb(module, generator)

    tensors: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        name = QWEN35_TEXT_PREFIX + key[len("model.") :] if key.startswith("model.") else key
        tensors[name] = value
    shared = {"embed_tokens.weight", "shared_head.weight"}
    for key, value in mtp.state_dict().items():
        if key not in shared:
            tensors[_mtp_checkpoint_name(key)] = value
    for key, value in vision.state_dict().items():
        tensors["model.visual." + key] = value
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, folder / "model.safetensors")

    top_type = "qwen3_5" if kind == "qwen3_5" else "qwen3_5_moe"
    arch = "Qwen3_5ForConditionalGeneration" if kind == "qwen3_5" else "Qwen3_5MoeForConditionalGeneration"
    config = {
        "architectures": [arch],
        "model_type": top_type,
        "text_config": text,
        "vision_config": dict(_VISION_CONFIG, model_type="qwen3_5_vision"),
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": False,
    }
    _write_json(folder / "config.json", config)
    _write_json(
        folder / "generation_config.json",
        {"bos_token_id": 248044, "eos_token_id": [248046, 248044], "pad_token_id": 248044,
         "do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 20},
    )
    _write_json(
        folder / "preprocessor_config.json",
        {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 4, "temporal_patch_size": 2,
         "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
         "size": {"shortest_edge": 1024, "longest_edge": 65536}},
    )


def _build_plain(kind: str, folder: Path, seed: int) -> None:
    text = _plain_config(kind)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = _causal_lm_class(kind)(_text_config_object(kind, text))
    _perturb(model, generator)
    # transformers' own writer: the published layout (a tied head is not stored), config and generation config.
    model.to(torch.float32 if kind == "llama" else torch.bfloat16).save_pretrained(folder)


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def build_tiny_checkpoint(kind: str, root: Path, seed: int = 0) -> Path:
    """Build (once) and return the folder of the tiny `kind` checkpoint under `root`."""
    if kind not in TINY_KINDS:
        raise ValueError(f"unknown tiny checkpoint kind {kind!r}; known: {', '.join(TINY_KINDS)}")
    builder = _build_qwen35 if kind.startswith("qwen3_5") else _build_plain
    return _build_once(Path(root) / f"{kind}-seed{seed}-v{BUILDER_VERSION}", lambda staging: builder(kind, staging, seed))


def _build_once(folder: Path, build: Callable[[Path], object]) -> Path:
    """`folder`, built by `build(staging)` unless it exists. The build goes to a sibling temp folder that is then
    renamed, so a concurrent or interrupted build never leaves half a checkpoint."""
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        build(staging)
        os.rename(staging, folder)
    except OSError:
        if not (folder / "config.json").exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _kind_of(config: dict) -> str:
    kind = config["model_type"]
    if kind not in TINY_KINDS:
        raise ValueError(f"not a tiny checkpoint kind: {kind}")
    return kind


def load_reference_model(path: Path):
    """The HF causal LM of a tiny checkpoint, fp32, with the checkpoint's exact weights."""
    config = json.loads((Path(path) / "config.json").read_text())
    kind = _kind_of(config)
    text = config.get("text_config", config)
    model = _causal_lm_class(kind)(_text_config_object(kind, text)).to(torch.float32)
    state = {}
    for name, value in load_file(str(Path(path) / "model.safetensors")).items():
        if name.startswith(QWEN35_TEXT_PREFIX):
            state["model." + name[len(QWEN35_TEXT_PREFIX) :]] = value.float()
        elif not name.startswith(("mtp.", "model.visual.")):
            state[name] = value.float()
    if text.get("tie_word_embeddings"):
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    _use_eager_experts(model)
    return model.eval()


def _use_eager_experts(module) -> None:
    """The reference runs HF's plain per-expert loop: its default `grouped_mm` path on the CPU has returned
    non-finite logits now and then (seen once on the MoE MTP layer in a fresh environment), which would make the
    reference, not the engine, the thing under test."""
    config = getattr(module, "config", None)
    if config is not None and getattr(config, "_experts_implementation", None) not in (None, "eager"):
        config._experts_implementation = "eager"


def load_reference_mtp(path: Path, model):
    """HF's generic MtpModel for a Qwen3.5 tiny checkpoint, sharing embeddings and head with `model`."""
    from transformers.modeling_layers import MtpModel

    mtp = MtpModel(model, 1).to(torch.float32)
    checkpoint = load_file(str(Path(path) / "model.safetensors"))
    shared = {"embed_tokens.weight", "shared_head.weight"}
    state = {k: checkpoint[_mtp_checkpoint_name(k)].float() for k in mtp.state_dict() if k not in shared}
    missing, unexpected = mtp.load_state_dict(state, strict=False)
    if unexpected or set(missing) - shared:
        raise RuntimeError(f"MTP weights do not fit MtpModel: missing {missing}, unexpected {unexpected}")
    _use_eager_experts(mtp)
    return mtp.eval()


def _conditional_generation(kind: str, text: dict):
    import transformers
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeConfig

    config_class, model_class = {
        "qwen3_5": (Qwen3_5Config, transformers.Qwen3_5ForConditionalGeneration),
        "qwen3_5_moe": (Qwen3_5MoeConfig, transformers.Qwen3_5MoeForConditionalGeneration),
    }[kind]
    fields = {k: v for k, v in text.items() if k != "model_type"}
    return model_class(config_class(text_config=fields, vision_config=dict(_VISION_CONFIG), tie_word_embeddings=False))


def build_saved_checkpoint(kind: str, root: Path, seed: int = 0) -> Path:
    """Build (once) and return the folder under `root` of the tiny `kind` checkpoint (a Qwen3.5 kind) written with
    save_pretrained; see the module doc."""
    if not kind.startswith("qwen3_5"):
        raise ValueError(f"build_saved_checkpoint builds the Qwen3.5 kinds, not {kind!r}")
    return _build_once(Path(root) / f"{kind}-saved-seed{seed}-v{BUILDER_VERSION}",
                       lambda staging: _save_pretrained_qwen35(kind, staging, seed))


def _save_pretrained_qwen35(kind: str, folder: Path, seed: int) -> None:
    from transformers.modeling_layers import MtpModel

    text = _qwen35_text_config(kind)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = _conditional_generation(kind, text)
    mtp = MtpModel(_causal_lm_class(kind)(_text_config_object(kind, text)), 1)
    _initialise_mtp(mtp, generator)
    for module in (model, mtp):
        _perturb(module, generator)
    # Small shards, so that even this tiny model is split and needs the index.
    model.to(torch.bfloat16).save_pretrained(folder, max_shard_size="20MB")
    mtp_shard = "model-mtp.safetensors"
    shared = {"embed_tokens.weight", "shared_head.weight"}
    mtp_tensors = _experts_per_expert({_mtp_checkpoint_name(k): v.to(torch.bfloat16).contiguous()
                                       for k, v in mtp.state_dict().items() if k not in shared})
    save_file(mtp_tensors, folder / mtp_shard, metadata={"format": "pt"})
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update(dict.fromkeys(mtp_tensors, mtp_shard))
    _write_json(index_path, index)


def _experts_per_expert(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MtpModel's fused routed experts (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]) in the
    one-tensor-per-expert names save_pretrained gives the decoder layers' experts (MTP has no save_pretrained)."""
    out = {}
    for name, value in tensors.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base, half = name[: -len("gate_up_proj")], value.shape[1] // 2
            for e in range(value.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = value[e, :half].contiguous()
                out[f"{base}{e}.up_proj.weight"] = value[e, half:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(value.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = value[e].contiguous()
        else:
            out[name] = value
    return out


def load_saved_reference(path: Path):
    """HF's from_pretrained of a build_saved_checkpoint folder, fp32 (its MTP shard is no part of the class)."""
    config = json.loads((Path(path) / "config.json").read_text())
    model, info = _conditional_generation(_kind_of(config), config["text_config"]).__class__.from_pretrained(
        path, dtype=torch.float32, output_loading_info=True)
    if info["missing_keys"] or info["mismatched_keys"]:
        raise RuntimeError(f"{path}: from_pretrained left weights at their init: {info}")
    _use_eager_experts(model)
    return model.eval()
