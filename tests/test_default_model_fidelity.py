"""The embedded default model (SmolLM2-135M-Instruct, a Q4_1 GGUF imported by ninfer.default_model) answers as the
file does: its weights are the file's own values bit for bit, its perplexity is HF transformers' on those values
within 1%, and its greedy answers to a few factual and coding prompts are HF's token for token."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hf_reference import llama_reference
from ninfer import _engine, _testing
from ninfer.artifact.gguf import logical_name
from ninfer.default_model import default_model_path

# Slow (tens of seconds on 2 busy cores: HF's forward passes), small: 2 windows, 4 prompts of 12 tokens.
WINDOW = 256  # tokens per perplexity window
WINDOWS = 2
ANSWER_TOKENS = 12
PROMPTS = (
    "What is the capital of Italy?",
    "How many legs does a spider have?",
    "Write a Python function that returns the square of a number.",
    "What does the SQL statement SELECT COUNT(*) FROM users do?",
)


@pytest.fixture(scope="module")
def default_artifact(smollm2_cache_home):
    return default_model_path(progress=False, folder=smollm2_cache_home / "ninfer")


@pytest.fixture(scope="module")
def reference(default_artifact):
    torch.set_num_threads(2)
    return llama_reference(default_artifact)


@pytest.fixture(scope="module")
def model(default_artifact):
    # One thread: idle OpenMP workers spin, and would take the cores HF runs on between our calls.
    return _testing.Model.open(str(default_artifact), max_context=1024, kv_dtype="f32", threads=1)


def _tokenizer(artifact):
    from tokenizers import Tokenizer

    manifest = json.loads(_engine.Artifact.open(str(artifact)).manifest_json())
    return Tokenizer.from_str(manifest["frontend"]["tokenizer_json"])


def test_weights_are_the_files_own_values(default_artifact, smollm2_gguf):
    from gguf import GGUFReader, quants

    art = _engine.Artifact.open(str(default_artifact))
    encodings = {t["name"]: t["encoding"] for t in json.loads(art.manifest_json())["tensors"]}
    kinds = set()
    for tensor in GGUFReader(smollm2_gguf).tensors:
        name, kind = logical_name(tensor.name), tensor.tensor_type.name
        kinds.add((kind, encodings[name]))
        expected = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        np.testing.assert_array_equal(np.array(art.dequantize(name)).reshape(expected.shape), expected,
                                      err_msg=name)
    assert kinds == {("Q4_1", "int4_affine"), ("Q8_0", "int8"), ("F32", "f32")}


def _negative_log_likelihood(logits: np.ndarray, targets: np.ndarray) -> float:
    logits = logits.astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return float((log_z - logits[np.arange(len(targets)), targets]).sum())


@pytest.mark.slow
def test_perplexity_is_the_files_own(default_artifact, model, reference, jargon_text):
    ids = _tokenizer(default_artifact).encode(jargon_text[20000:60000], add_special_tokens=False).ids
    assert len(ids) >= WINDOWS * WINDOW
    ours = theirs = 0.0
    for w in range(WINDOWS):
        window = np.array(ids[w * WINDOW:(w + 1) * WINDOW], np.int32)
        seq = model.new_sequence()
        logits = model.prefill(seq, window, all_logits=True)
        model.release(seq)
        with torch.no_grad():
            hf = reference(torch.tensor([window.tolist()])).logits[0].numpy()
        ours += _negative_log_likelihood(logits[:-1], window[1:])
        theirs += _negative_log_likelihood(hf[:-1], window[1:])
    count = WINDOWS * (WINDOW - 1)
    ppl_ours, ppl_theirs = np.exp(ours / count), np.exp(theirs / count)
    assert abs(ppl_ours / ppl_theirs - 1) < 0.01, (ppl_ours, ppl_theirs)


@pytest.mark.slow
@pytest.mark.parametrize("question", PROMPTS)
def test_greedy_answers_are_hfs(default_artifact, model, reference, question):
    tokenizer = _tokenizer(default_artifact)
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    eos = json.loads(_engine.Artifact.open(str(default_artifact)).manifest_json())["config"]["eos_token_ids"]
    seq = model.new_sequence()
    token = int(model.prefill(seq, np.array(ids, np.int32))[-1].argmax())
    ours = [token]
    while len(ours) < ANSWER_TOKENS and token not in eos:
        token = int(model.decode(seq, token)[0].argmax())
        ours.append(token)
    model.release(seq)
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=ANSWER_TOKENS, do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos[0])
    theirs = out[0, len(ids):].tolist()
    assert ours == theirs, (tokenizer.decode(ours), tokenizer.decode(theirs))
