"""The MTP head's drafts on the CPU backend: Model.mtp_drafts equals the argmax chain of mtp_logits steps
(tests/mtp_drafts.py) for 1..5 drafts, dense and MoE; and its refusals."""

from __future__ import annotations

import numpy as np
import pytest
from live_servers import artifact_for
from mtp_drafts import check_drafts_against_the_twin
from ninfer import _testing
from ninfer.errors import EngineError


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe"])
def model(request, pytestconfig):
    path = artifact_for(pytestconfig, request.getfixturevalue(f"tiny_{request.param}"))
    return _testing.Model.open(str(path), max_context=256, max_sequences=4, kv_dtype="f32", threads=2)


@pytest.mark.parametrize("drafts", [1, 2, 3, 5])
def test_drafts_are_the_argmax_chain_of_the_head(model, drafts):
    rng = np.random.default_rng()
    prompt = rng.integers(0, model.config["vocab_size"], int(rng.integers(2, 40))).astype(np.int32)
    check_drafts_against_the_twin(model, prompt, drafts, rel_tol=0)


def test_no_drafts_writes_the_rows_only(model):
    prompt = np.arange(1, 9, dtype=np.int32)
    seq = model.new_sequence()
    model.prefill(seq, prompt, all_logits=True)
    hidden = np.ascontiguousarray(model.hidden[:-1])
    assert model.mtp_drafts(seq, hidden, np.ascontiguousarray(prompt[1:]), 0, 0) == []


def test_drafts_past_the_reserved_pages_are_refused(model):
    prompt = np.arange(1, 61, dtype=np.int32)  # 60 tokens: one 64-token page
    seq = model.new_sequence()
    model.prefill(seq, prompt, all_logits=True)
    hidden = np.ascontiguousarray(model.hidden[:-1])
    with pytest.raises(EngineError, match="beyond the sequence's reserved 64 tokens"):
        model.mtp_drafts(seq, hidden, np.ascontiguousarray(prompt[1:]), 0, 8)
