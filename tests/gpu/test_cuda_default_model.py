"""The embedded default model (SmolLM2-135M, its Q4_1 blocks kept as int4_affine, the Q8_0 embedding as int8) on the
CUDA backend: logits within f32-reordering distance of the CPU engine's, and the same greedy answers (the CPU engine
gives HF's: tests/test_default_model_fidelity.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from ninfer import _engine, _testing
from ninfer.default_model import default_model_path

pytestmark = pytest.mark.gpu

PROMPTS = ("What is the capital of Italy?", "Write a Python function that returns the square of a number.")
ANSWER_TOKENS = 16


@pytest.fixture(scope="module")
def default_artifact(smollm2_cache_home):
    return default_model_path(progress=False, folder=smollm2_cache_home / "ninfer")


@pytest.mark.parametrize("question", PROMPTS)
def test_default_model_answers_on_cuda_as_on_cpu(default_artifact, question):
    from tokenizers import Tokenizer

    manifest = json.loads(_engine.Artifact.open(str(default_artifact)).manifest_json())
    assert {t["encoding"] for t in manifest["tensors"]} == {"int4_affine", "int8", "f32"}
    tokenizer = Tokenizer.from_str(manifest["frontend"]["tokenizer_json"])
    ids = np.array(tokenizer.encode(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n",
                                    add_special_tokens=False).ids, np.int32)
    answers = {}
    for backend in ("cuda", "cpu"):
        model = _testing.Model.open(str(default_artifact), max_context=512, kv_dtype="f32", threads=2,
                                   backend=backend)
        seq = model.new_sequence()
        logits = model.prefill(seq, ids, all_logits=True)
        answers[backend] = {"prefill": logits, "tokens": []}
        token = int(logits[-1].argmax())
        for _ in range(ANSWER_TOKENS):
            answers[backend]["tokens"].append(token)
            token = int(model.decode(seq, token)[0].argmax())
    got, want = answers["cuda"]["prefill"], answers["cpu"]["prefill"]
    assert float(np.abs(got - want).max()) <= 1e-3 * float(np.abs(want).max())
    assert answers["cuda"]["tokens"] == answers["cpu"]["tokens"]
