"""The tiny llama the pre-quantised-checkpoint tests (tests/test_convert_{compressed_int4,gptq_awq,nvfp4}.py)
quantise, and the two sides they compare: HF transformers on given weights, and the engine on an artifact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from logit_tolerance import logit_tolerance
from ninfer import _testing
from ninfer.artifact.convert import convert

# 384 columns: groups of 32, 64 and 128 all divide it (and 16-column NVFP4 blocks); q/k/v/o/gate/up take 256
# inputs, down 384.
CONFIG = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 384, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "initializer_range": 0.05,
          "tie_word_embeddings": False}


def convert_layers_as(encoding: str, folder: Path, out: Path) -> Path:
    """`folder` converted with the layer matrices asked for as `encoding` (a pre-quantised weight keeps its own
    form) and everything else f32, so only the checkpoint's own rounding remains."""
    recipe = out.with_suffix(".json")
    recipe.write_text(json.dumps({"rules": [{"pattern": "layers.*", "encoding": encoding, "ndim": 2},
                                            {"pattern": "*", "encoding": "f32"}]}))
    return convert(folder, out, recipe=str(recipe), progress=False)


def hf_logits(weights: dict[str, torch.Tensor], tokens: np.ndarray) -> np.ndarray:
    """HF LlamaForCausalLM (f32) with exactly `weights`."""
    import transformers

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    model.load_state_dict(weights)
    with torch.no_grad():
        return model(torch.tensor(tokens[None].astype(np.int64))).logits[0].numpy()


def engine_logits(artifact: Path, tokens: np.ndarray) -> np.ndarray:
    model = _testing.Model.open(str(artifact), kv_dtype="f32", threads=2, max_context=256)
    return model.prefill(model.new_sequence(), tokens, all_logits=True)


def assert_logits_match(artifact: Path, weights: dict[str, torch.Tensor]) -> None:
    tokens = np.random.default_rng(3).integers(0, CONFIG["vocab_size"], 24).astype(np.int32)
    theirs = hf_logits(weights, tokens)
    assert np.abs(engine_logits(artifact, tokens) - theirs).max() <= logit_tolerance(artifact) * np.abs(theirs).max()
