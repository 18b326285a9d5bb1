"""Tiny random Hugging Face checkpoints, built from a seed, for converter and engine parity tests.

API (other test modules use only these):

    build_tiny_checkpoint(kind, root, seed=0) -> Path
        A folder written by transformers' own save_pretrained, built once under `root` and reused (keyed by kind,
        seed and BUILDER_VERSION). kind is one of TINY_KINDS: "qwen3_5", "qwen3_5_moe", "llama", "qwen2", "qwen3".
    load_reference_model(path) -> transformers PreTrainedModel (fp32, eval mode)
        HF's from_pretrained of the folder as the causal LM (Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM for the
        Qwen3.5 kinds: text weights only, HF's loader dropping the VLM prefix).
    load_reference_mtp(path, model) -> transformers MtpModel (fp32, eval mode)
        HF's generic MTP head for a Qwen3.5 checkpoint, sharing embeddings and lm_head with `model`.
    load_reference_vlm(path) -> transformers Qwen3_5(Moe)ForConditionalGeneration (fp32, eval mode)
        HF's from_pretrained of a Qwen3.5 folder: text model, lm_head and vision tower.
    fused_experts(tensors) -> dict
        Per-expert routed-expert tensors stacked into transformers' in-memory fused layout.

What the checkpoints look like and why:
- Every kind is written by save_pretrained, the layout published checkpoints have. The Qwen3.5 kinds are
  Qwen3_5(Moe)ForConditionalGeneration (text + a tiny vision tower, top-level `Qwen3_5Config` with text_config and
  vision_config like released models) in bf16 shards listed by model.safetensors.index.json (small shards, so even
  this tiny model is split): `model.language_model.*`, `lm_head.weight`, `model.visual.*`, routed experts one tensor
  per expert (`mlp.experts.N.gate_proj.weight`, ...). The plain kinds are one model.safetensors (llama in fp32, to
  exercise an fp32 source; a tied head is not stored).
- The one layout written by hand: the Qwen3.5 MTP layer (`mtp.*`), which no transformers class holds, goes into
  one more shard listed in the index, its experts per expert like the decoder layers' (as published checkpoints
  store them). Besides the weights, save_pretrained writes config.json and generation_config.json; the Qwen3.5
  kinds' preprocessor_config.json is plain JSON with the published fields. Tests that need another layout (fused
  experts, pre-quantised weights, damaged files) derive it from these folders, explicitly.
- The Qwen3.5 vocabulary is the real 248,320 rows, so the real 248k tokenizer's ids are all valid.
- 8 decoder layers, L,L,L,F,L,L,L,F; GDN with Hv = 2*Hk and Dv != Dk; partial M-RoPE with theta set explicitly.
- Random init leaves zero-centred norms at 0, the GDN norm at 1 and A_log/dt_bias at their init; all of these are
  redrawn so that every convention (1+w vs w, exp(A_log), softplus(a + dt_bias)) changes the output.
- Every weight is rounded to a bf16-representable value, so a bf16 artifact holds exactly the reference weights.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

TINY_KINDS = ("qwen3_5", "qwen3_5_moe", "llama", "qwen2", "qwen3")
# Bump when the builder changes what it writes, so cached checkpoints are rebuilt.
BUILDER_VERSION = 4

QWEN35_VOCAB = 248320
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
    from transformers import GenerationConfig
    from transformers.modeling_layers import MtpModel
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    text = _qwen35_text_config(kind)
    # The values are drawn in the parts' order (causal LM, its MTP head, the tower), the order every builder
    # version has drawn them in, so a seed keeps giving the weights the tests were written against; they are then
    # placed in the ConditionalGeneration model that save_pretrained writes. MtpModel needs the causal LM anyway.
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    causal = _causal_lm_class(kind)(_text_config_object(kind, text))
    mtp = MtpModel(causal, 1)
    _initialise_mtp(mtp, generator)
    vision = Qwen3_5VisionModel(Qwen3_5VisionConfig(**_VISION_CONFIG))
    for module in (causal, mtp, vision):
        _perturb(module, generator)
    model = _conditional_generation(kind, text)
    model.model.language_model.load_state_dict(causal.model.state_dict())
    model.lm_head.load_state_dict(causal.lm_head.state_dict())
    model.model.visual.load_state_dict(vision.state_dict())
    model.generation_config = GenerationConfig(bos_token_id=248044, eos_token_id=[248046, 248044],
                                               pad_token_id=248044, do_sample=True, temperature=1.0, top_p=0.95,
                                               top_k=20)
    # Small shards, so that even this tiny model is split and needs the index.
    model.to(torch.bfloat16).save_pretrained(folder, max_shard_size="20MB")
    _add_mtp_shard(folder, mtp)
    # The image processor's config is no weights: the fields published checkpoints have (HF's image processor, which
    # would write it, needs torchvision, which the tests do not install).
    _write_json(
        folder / "preprocessor_config.json",
        {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 4, "temporal_patch_size": 2,
         "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
         "size": {"shortest_edge": 1024, "longest_edge": 65536}},
    )


def _add_mtp_shard(folder: Path, mtp) -> None:
    """The checkpoint's one hand-written part: the MTP layer (no transformers class holds it, so save_pretrained
    cannot write it) in its own shard, added to the index, named and laid out as published checkpoints store it."""
    shard = "model-mtp.safetensors"
    shared = {"embed_tokens.weight", "shared_head.weight"}
    tensors = _experts_per_expert({_mtp_checkpoint_name(k): v.to(torch.bfloat16).contiguous()
                                   for k, v in mtp.state_dict().items() if k not in shared})
    save_file(tensors, folder / shard, metadata={"format": "pt"})
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update(dict.fromkeys(tensors, shard))
    _write_json(index_path, index)


def _build_plain(kind: str, folder: Path, seed: int) -> None:
    text = _plain_config(kind)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = _causal_lm_class(kind)(_text_config_object(kind, text))
    _perturb(model, generator)
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


def _loaded(model_class, path: Path, **options):
    """HF's from_pretrained of `path` in fp32, refusing a load that left any weight at its init."""
    model, info = model_class.from_pretrained(path, dtype=torch.float32, output_loading_info=True, **options)
    if info["missing_keys"] or info["mismatched_keys"]:
        raise RuntimeError(f"{path}: from_pretrained left weights at their init: {info}")
    _use_eager_experts(model)
    return model.eval()


def load_reference_model(path: Path):
    """The HF causal LM of a tiny checkpoint, fp32, with the checkpoint's exact weights."""
    config = json.loads((Path(path) / "config.json").read_text())
    kind = _kind_of(config)
    # The text config with the two fields HF's generic MtpModel reads (see _text_config_object).
    text = _text_config_object(kind, config.get("text_config", config))
    return _loaded(_causal_lm_class(kind), path, config=text)


def _use_eager_experts(module) -> None:
    """The reference runs HF's plain per-expert loop: its default `grouped_mm` path on the CPU has returned
    non-finite logits now and then (seen once on the MoE MTP layer in a fresh environment), which would make the
    reference, not the engine, the thing under test."""
    config = getattr(module, "config", None)
    if config is not None and getattr(config, "_experts_implementation", None) not in (None, "eager"):
        config._experts_implementation = "eager"


def _checkpoint_tensors(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's shards (as its index lists them) whose name starts with `prefix`."""
    from safetensors import safe_open

    weight_map = json.loads((Path(path) / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        wanted = [name for name, file in weight_map.items() if file == shard and name.startswith(prefix)]
        with safe_open(Path(path) / shard, framework="pt") as f:
            tensors.update({name: f.get_tensor(name) for name in wanted})
    return tensors


def load_reference_mtp(path: Path, model):
    """HF's generic MtpModel for a Qwen3.5 tiny checkpoint, sharing embeddings and head with `model`."""
    from transformers.modeling_layers import MtpModel

    mtp = MtpModel(model, 1).to(torch.float32)
    checkpoint = fused_experts(_checkpoint_tensors(path, "mtp."))
    shared = {"embed_tokens.weight", "shared_head.weight"}
    state = {k: checkpoint[_mtp_checkpoint_name(k)].float() for k in mtp.state_dict() if k not in shared}
    missing, unexpected = mtp.load_state_dict(state, strict=False)
    if unexpected or set(missing) - shared:
        raise RuntimeError(f"MTP weights do not fit MtpModel: missing {missing}, unexpected {unexpected}")
    _use_eager_experts(mtp)
    return mtp.eval()


def _conditional_generation_class(kind: str):
    import transformers

    return {"qwen3_5": transformers.Qwen3_5ForConditionalGeneration,
            "qwen3_5_moe": transformers.Qwen3_5MoeForConditionalGeneration}[kind]


def _conditional_generation(kind: str, text: dict):
    """The ConditionalGeneration model (text + vision tower, freshly initialised) for a Qwen3.5 text config."""
    fields = {k: v for k, v in text.items() if k != "model_type"}
    model_class = _conditional_generation_class(kind)
    return model_class(model_class.config_class(text_config=fields, vision_config=dict(_VISION_CONFIG),
                                                tie_word_embeddings=False))


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


def fused_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of _experts_per_expert: every layer's per-expert projections stacked into transformers'
    in-memory layout (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I])."""
    out, experts = {}, {}
    for name, value in tensors.items():
        match = re.fullmatch(r"(.+\.mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight", name)
        if match:
            base, expert, part = match.groups()
            experts.setdefault(base, {}).setdefault(part, {})[int(expert)] = value
        else:
            out[name] = value
    for base, parts in experts.items():
        gate, up, down = ([parts[part][e] for e in range(len(parts[part]))] for part in ("gate", "up", "down"))
        out[base + "gate_up_proj"] = torch.cat([torch.stack(gate), torch.stack(up)], dim=1)
        out[base + "down_proj"] = torch.stack(down)
    return out


def load_reference_vlm(path: Path):
    """HF's from_pretrained of a Qwen3.5 tiny checkpoint as the ConditionalGeneration model, fp32 (its MTP shard is
    no part of the class)."""
    config = json.loads((Path(path) / "config.json").read_text())
    return _loaded(_conditional_generation_class(_kind_of(config)), path)
