"""`ninfer convert`: turn a Hugging Face safetensors folder or a GGUF file into a `.ninfer` artifact.

The source readers (`hf.py`, `gguf.py`) each return a `Source`: the normalised model config
(docs/artifact-format.md), the tensors under their logical names with a loader per tensor, and what the source
knows of its frontend (tokenizer, chat template, generation defaults). This module picks the reader, fills in what
the source lacks (the real Qwen3.5 tokenizer, the project's chat templates), plans every tensor's encoding with the
recipe and streams the tensors one at a time through the artifact writer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ninfer.artifact.encodings import PLAIN_ENCODINGS, decode, encode
from ninfer.artifact.format import QWEN35_FAMILY, SUPPORTED_ARCHITECTURES
from ninfer.artifact.gguf_blocks import NativeTensor
from ninfer.artifact.recipes import Recipe, load_recipe
from ninfer.artifact.writer import ArtifactWriter, TensorPlan
from ninfer.errors import ConversionError, UnsupportedArchitectureError
from ninfer.frontend.templates import QWEN_FAMILY_TEMPLATES, TEMPLATE_NAMES, load_chat_template

log = logging.getLogger(__name__)

# <|im_end|> and <|endoftext|> of the Qwen3.5 tokenizer: a chat turn ends at either.
QWEN35_EOS = (248046, 248044)
QWEN35_PAD = 248044
# `--template auto` (the default): the checkpoint's own template, else this per family.
AUTO_TEMPLATE = "auto"
DEFAULT_QWEN35_TEMPLATE = "qwen3_5"
DEFAULT_PLAIN_TEMPLATE = "chatml"


@dataclass(frozen=True)
class SourceTensor:
    """One logical tensor of a source; `load()` returns it as a float32 array of `shape` (read on demand).
    `native`: a pre-quantised source tensor's own encoding, which a quantising recipe keeps (gguf_blocks.py)."""

    name: str
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]
    native: NativeTensor | None = None


@dataclass
class Source:
    """What a source reader found: everything the artifact needs except what the driver adds."""

    kind: str  # "hf" | "gguf"
    path: Path
    architecture: str  # the source's own name for it (model_type or general.architecture)
    config: dict  # normalised, see docs/artifact-format.md
    tensors: list[SourceTensor]
    tokenizer_json: str | None = None
    chat_template: str | None = None
    generation_defaults: dict = field(default_factory=dict)
    preprocessing: dict = field(default_factory=dict)
    special_tokens: dict = field(default_factory=dict)  # bos, eos (list), pad


def decoder_config(**fields: object) -> dict:
    """A normalised model config: the given fields over the defaults of a plain (non-hybrid, dense) decoder."""
    config: dict = {
        "norm_offset": False, "attn_output_gate": False, "qk_norm": False, "qkv_bias": False,
        "linear_attention": None, "moe": None, "mtp": None, "bos_token_id": None, "eos_token_ids": [],
    }
    config.update(fields)
    required = ("arch", "vocab_size", "hidden_size", "num_layers", "layer_types", "num_heads", "num_kv_heads",
                "head_dim", "intermediate_size", "rms_norm_eps", "rope", "tie_word_embeddings",
                "max_position_embeddings")
    missing = [key for key in required if key not in config]
    if missing:
        raise ConversionError(f"internal: normalised config lacks {', '.join(missing)}")
    return config


def unsupported_architecture(path: Path, what: str, name: str) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"{path}: {what} {name!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def open_source(src: Path) -> Source:
    """Read a source's metadata (no weights yet): a HF folder or a .gguf file."""
    src = Path(src)
    if src.is_dir():
        from ninfer.artifact.hf import open_hf_folder

        return open_hf_folder(src)
    if src.is_file() and src.suffix.lower() == ".gguf":
        from ninfer.artifact.gguf import open_gguf_file

        return open_gguf_file(src)
    if not src.exists():
        raise ConversionError(f"{src}: no such file or folder")
    raise ConversionError(f"{src}: not a Hugging Face model folder or a .gguf file")


def choose_chat_templates(source: Source, template: str) -> dict[str, str]:
    """The artifact's chat templates: `default` plus, when a project template replaces it, the checkpoint's own."""
    if template != AUTO_TEMPLATE and template not in TEMPLATE_NAMES:
        raise ConversionError(f"unknown chat template {template!r}; choose {AUTO_TEMPLATE} or one of "
                              f"{', '.join(TEMPLATE_NAMES)}")
    if template == AUTO_TEMPLATE:
        if source.chat_template:
            return {"default": source.chat_template}
        qwen = source.config["arch"] in QWEN35_FAMILY
        template = DEFAULT_QWEN35_TEMPLATE if qwen else DEFAULT_PLAIN_TEMPLATE
    if template in QWEN_FAMILY_TEMPLATES and source.config["arch"] not in QWEN35_FAMILY:
        raise ConversionError(f"chat template {template} is for the Qwen3.5 family, not {source.config['arch']}")
    templates = {"default": load_chat_template(template)}
    if source.chat_template:
        templates["checkpoint"] = source.chat_template
    return templates


def build_frontend(source: Source, template: str) -> dict:
    tokenizer_json = source.tokenizer_json
    if tokenizer_json is None and source.config["arch"] in QWEN35_FAMILY:
        from ninfer.artifact.tokenizer_build import qwen35_tokenizer_json

        tokenizer_json = qwen35_tokenizer_json()
    if tokenizer_json is None:
        log.warning("%s has no tokenizer: the artifact will take and give token ids only", source.path)
    return {
        "tokenizer_json": tokenizer_json,
        "chat_templates": choose_chat_templates(source, template),
        "generation_defaults": source.generation_defaults,
        "preprocessing": source.preprocessing,
        "special_tokens": source.special_tokens,
    }


def _keeps_native(tensor: SourceTensor, encoding: str) -> bool:
    """A quantised source tensor keeps its own encoding unless the recipe wants it as plain floats: a quantising
    recipe never re-quantises what is already quantised."""
    return tensor.native is not None and encoding not in PLAIN_ENCODINGS


def plan_tensors(tensors: list[SourceTensor], recipe: Recipe) -> list[TensorPlan]:
    plans = []
    for tensor in tensors:
        encoding, group_size = recipe.plan(tensor.name, tensor.shape)
        if _keeps_native(tensor, encoding):
            encoding, group_size = tensor.native.encoding, tensor.native.group_size
        plans.append(TensorPlan(tensor.name, tuple(tensor.shape), encoding, group_size))
    return plans


def relative_error(stored: np.ndarray, values: np.ndarray) -> float:
    """||stored - values|| / ||values|| (0 for an all-zero tensor stored exactly)."""
    norm = float(np.linalg.norm(values))
    diff = float(np.linalg.norm(stored.astype(np.float64) - values))
    return diff / norm if norm else diff


def _write_tensor(writer: ArtifactWriter, path: Path, tensor: SourceTensor, plan: TensorPlan) -> None:
    native = tensor.native if tensor.native is not None and plan.encoding == tensor.native.encoding else None
    if native is not None and native.exact:
        writer.write_encoded(tensor.name, native.blobs())
        return
    values = tensor.load()
    if values.shape != tensor.shape:
        raise ConversionError(f"{path}: tensor {tensor.name} loaded as {list(values.shape)}, "
                              f"expected {list(tensor.shape)}")
    if native is None:
        writer.write(tensor.name, values)
        return
    # A block format with no exact counterpart: rearranged with its scales rounded, or re-encoded with no fewer
    # bits. Say what that costs.
    how = "rearranged" if native.blobs is not None else "re-encoded"
    blobs = native.blobs() if native.blobs is not None else encode(values, plan.encoding, plan.group_size)
    error = relative_error(decode(blobs, plan.encoding, plan.shape, plan.group_size), values)
    # Measured exact (e.g. bf16 scales that f16 holds): nothing was lost, so nothing to warn about.
    report = log.warning if error else log.info
    grouping = f" g{plan.group_size}" if plan.group_size else ""
    report("%s: %s as %s%s, relative error %.2e", tensor.name, how, plan.encoding, grouping, error)
    writer.write_encoded(tensor.name, blobs)


def convert(src: str | Path, out: str | Path, recipe: str = "bf16", template: str = AUTO_TEMPLATE,
            progress: bool = True, mtp_head: str | Path | None = None, draft_vocab: int | None = None) -> Path:
    """Convert `src` into the artifact `out`; returns `out`. Nothing appears under `out` unless it completes.
    `mtp_head`: a head file (mtp_head.py) to attach to a model without one. `draft_vocab`: the MTP head's drafts
    score only that many lm-head rows (draft_vocab.py)."""
    recipe_obj = load_recipe(recipe)
    source = open_source(Path(src))
    if mtp_head is not None:
        from ninfer.artifact.mtp_head import attach_mtp_head

        source = attach_mtp_head(source, Path(mtp_head))
    if draft_vocab is not None:
        from ninfer.artifact.draft_vocab import attach_draft_vocab

        source = attach_draft_vocab(source, draft_vocab)
    names = [t.name for t in source.tensors]
    if len(set(names)) != len(names):
        raise ConversionError(f"{source.path}: two source tensors map to the same logical name")
    frontend = build_frontend(source, template)
    plans = plan_tensors(source.tensors, recipe_obj)
    origin = {"kind": source.kind, "path": str(source.path), "architecture": source.architecture}
    if mtp_head is not None:
        origin["mtp_head"] = str(Path(mtp_head).resolve())
    with ArtifactWriter(out, config=source.config, tensors=plans, frontend=frontend,
                        recipe=recipe_obj.to_json(), source=origin, progress=progress) as writer:
        for tensor, plan in zip(source.tensors, plans, strict=True):
            _write_tensor(writer, source.path, tensor, plan)
    return Path(out)
