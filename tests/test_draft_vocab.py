"""The drafts' lm-head shortlist (`ninfer convert --draft-vocab N`, python/ninfer/artifact/draft_vocab.py): which
ids it keeps, the converter's refusals, drafts scored over the shortlist only (against the full head's logits at
those ids), and speculative output unchanged (verification reads the full head)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from live_servers import artifact_for
from mtp_drafts import check_drafts_against_the_twin
from ninfer import _testing
from ninfer.artifact.convert import convert
from ninfer.artifact.draft_vocab import draft_vocab_ids
from ninfer.artifact.reader import read_artifact
from ninfer.engine import Engine, EngineOptions, Request, SamplingParams
from ninfer.errors import ArtifactError, ConversionError, EngineError


def test_the_shortlist_is_the_lowest_ids_and_the_end_tokens():
    ids = draft_vocab_ids(1000, [998, 5], 10)
    assert ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 998]
    assert draft_vocab_ids(1000, [], 3).tolist() == [0, 1, 2]
    for rows in (0, 1000, -1):
        with pytest.raises(ConversionError, match="--draft-vocab"):
            draft_vocab_ids(1000, [], rows)
    with pytest.raises(ConversionError, match="end-of-sequence"):
        draft_vocab_ids(1000, [7, 8, 9], 2)


@pytest.fixture(scope="module")
def shortlisted(tiny_qwen3_5, pytestconfig):
    return artifact_for(pytestconfig, tiny_qwen3_5, draft_vocab=96)


def _shortlist(path) -> np.ndarray:
    (blob,) = read_artifact(path).tensor_bytes("mtp.draft_vocab").values()
    return np.asarray(blob).astype(np.int64)


def test_drafts_score_the_shortlist_only(shortlisted):
    ids = _shortlist(shortlisted)
    assert len(ids) == 96 and np.all(np.diff(ids) > 0)
    model = _testing.Model.open(str(shortlisted), max_context=256, max_sequences=4, kv_dtype="f32", threads=2)
    rng = np.random.default_rng()
    for drafts in (1, 3):
        prompt = rng.integers(0, model.config["vocab_size"], int(rng.integers(2, 40))).astype(np.int32)
        got = check_drafts_against_the_twin(model, prompt, drafts, rel_tol=0, shortlist=ids)
        assert set(got) <= set(ids.tolist())


def test_speculative_output_with_a_shortlist_is_plain_decoding(shortlisted):
    rng = np.random.default_rng()
    prompts = [rng.integers(0, 200, n).tolist() for n in (9, 64, 70)]

    async def run(engine):
        async def one(prompt):
            tokens = []
            request = Request(prompt, SamplingParams(temperature=0), max_new_tokens=12, stop_token_ids=())
            async for ev in engine.generate(request):
                tokens += ev.token_ids
            return tokens
        return await asyncio.gather(*(one(p) for p in prompts))

    outputs = {}
    for name, spec in (("plain", {}), ("spec", {"spec": "mtp", "draft_tokens": 3})):
        options = EngineOptions(backend="cpu", max_context=256, max_concurrency=3, kv_dtype="f32", threads=2, **spec)
        with Engine.open_sync(shortlisted, options) as engine:
            outputs[name] = asyncio.run(run(engine))
            if spec:
                assert engine.stats().draft_tokens > 0
    assert outputs["spec"] == outputs["plain"]


def test_a_shortlist_needs_an_mtp_head(tiny_llama, tmp_path):
    with pytest.raises(ConversionError, match="--draft-vocab needs a model with an MTP head"):
        convert(tiny_llama, tmp_path / "x.ninfer", recipe="bf16", progress=False, draft_vocab=16)
    assert not (tmp_path / "x.ninfer").exists()


def test_a_shortlist_of_ids_out_of_order_is_refused_at_load(shortlisted, tmp_path):
    """The loader checks the ids (ascending, integral, in the vocabulary): a hand-made artifact cannot point a
    draft at a row that is not a token. (Checksums off: the file is patched in place.)"""
    info = read_artifact(shortlisted)
    entry = info.tensor("mtp.draft_vocab")
    (blob,) = entry["blobs"].values()
    bad = tmp_path / "bad.ninfer"
    raw = bytearray(shortlisted.read_bytes())
    at = info.data_offset + blob["offset"]
    raw[at + 12:at + 16] = raw[at + 8:at + 12]  # ids[3] = ids[2]
    bad.write_bytes(bytes(raw))
    with pytest.raises((ArtifactError, EngineError), match="mtp.draft_vocab"):
        _testing.Model.open(str(bad), max_context=64, verify_checksums=False)
