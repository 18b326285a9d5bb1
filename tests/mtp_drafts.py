"""Model.mtp_drafts (the drafts' fast path: logits, argmax and hidden rows stay on the backend) against its slow
twin, Model.mtp_logits step by step with the argmax taken on the host from the copied-back logits."""

from __future__ import annotations

import numpy as np


def check_drafts_against_the_twin(model, prompt: np.ndarray, drafts: int, rel_tol: float,
                                  shortlist: np.ndarray | None = None) -> list[int]:
    """Drafts after `prompt`'s MTP rows, on two sequences holding the same prompt. rel_tol 0: each draft is the twin
    step's argmax exactly (a batch-invariant backend); else within rel_tol of the twin's largest logit (the twin's
    lm-head runs on more rows, which sums in another order on the CUDA backend). `shortlist`: the artifact's draft
    ids (`ninfer convert --draft-vocab`): the twin's argmax is taken over those columns of the full head's logits
    (the same rows in the same encoding under the bf16 recipe). The twin continues with the fast path's drafts, so
    one near-tie does not fork the chains. Returns the drafts."""
    rows = len(prompt) - 1
    fast, twin = model.new_sequence(), model.new_sequence()
    model.prefill(fast, prompt, all_logits=True)
    hidden = np.ascontiguousarray(model.hidden[:rows])
    model.prefill(twin, prompt, all_logits=True)
    next_tokens = np.ascontiguousarray(prompt[1:])
    got = model.mtp_drafts(fast, hidden, next_tokens, 0, drafts)
    assert len(got) == drafts
    ids = np.arange(model.config["vocab_size"]) if shortlist is None else np.asarray(shortlist)
    logits = model.mtp_logits(twin, hidden, next_tokens, 0)[-1]
    for j, draft in enumerate(got):
        scored = logits[ids]
        if rel_tol == 0:
            want = int(ids[np.argmax(scored)])
            assert draft == want, f"draft {j}: {draft}, the twin's argmax {want}"
        else:
            assert draft in set(ids.tolist()), f"draft {j}: {draft} is not in the shortlist"
            assert logits[draft] >= scored.max() - rel_tol * np.abs(scored).max(), (
                f"draft {j}: logit {logits[draft]} of token {draft}, the twin's largest {scored.max()}")
        if j + 1 < drafts:  # the next step: this step's mtp.norm row and draft, one position on
            step_hidden = np.ascontiguousarray(model.mtp_hidden[-1:])
            logits = model.mtp_logits(twin, step_hidden, np.array([draft], np.int32), rows + j)[0]
    return got
