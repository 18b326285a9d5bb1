"""The MTP head's draft shortlist (`ninfer convert --draft-vocab N`, docs/speculative-decoding.md): drafts score only
N rows of the lm-head instead of the whole vocabulary; the verify pass always uses the full head, so the output is
the same, and only drafts outside the shortlist are lost (a draft the target would have accepted).

Which rows: the N most frequent tokens as the tokenizer ranks them. A byte-level BPE tokenizer (Llama 3, Qwen,
SmolLM) numbers its tokens in merge order, and merges are learned most frequent first, so the lowest ids are the
most frequent in the tokenizer's training text; the model's end-of-sequence tokens are always kept (an answer ends
on one). Two tensors are added: `mtp.draft_vocab`, the ids ([N] f32: exact integers below 2^24), ascending, and
`mtp.draft_head`, those rows of the lm-head (of the embedding when tied), encoded by the recipe like any matrix.
"""

from __future__ import annotations

import numpy as np

from ninfer.artifact.convert import Source, SourceTensor
from ninfer.errors import ConversionError

MAX_EXACT_ID = 1 << 24  # f32 holds every integer below it exactly


def draft_vocab_ids(vocab_size: int, eos_ids: list[int], rows: int) -> np.ndarray:
    """The shortlist: the end-of-sequence ids and the lowest other ids, `rows` in all, ascending."""
    keep = sorted({int(e) for e in eos_ids if 0 <= int(e) < vocab_size})
    if not 0 < rows < vocab_size:
        raise ConversionError(f"--draft-vocab {rows}: must be between 1 and the vocabulary size {vocab_size} "
                              "(exclusive)")
    if rows < len(keep):
        raise ConversionError(f"--draft-vocab {rows}: fewer rows than the model's {len(keep)} end-of-sequence tokens")
    if vocab_size > MAX_EXACT_ID:
        raise ConversionError(f"a vocabulary of {vocab_size} tokens: draft ids are stored as f32, exact below 2^24")
    chosen = set(keep)
    for token in range(vocab_size):  # then the lowest ids, until there are `rows`
        if len(chosen) == rows:
            break
        chosen.add(token)
    return np.array(sorted(chosen), dtype=np.int64)


def attach_draft_vocab(source: Source, rows: int) -> Source:
    """`source` with the shortlist's two tensors; ConversionError when the model has no MTP head."""
    config = source.config
    if not config.get("mtp"):
        raise ConversionError(f"{source.path}: --draft-vocab needs a model with an MTP head (none here; "
                              "--mtp-head FILE attaches one)")
    by_name = {t.name: t for t in source.tensors}
    head = by_name.get("lm_head") or by_name.get("embed")
    if head is None:
        raise ConversionError(f"{source.path}: no lm_head or embedding to take the draft rows from")
    vocab, hidden = head.shape
    ids = draft_vocab_ids(vocab, list(config.get("eos_token_ids") or []), rows)

    def draft_rows() -> np.ndarray:
        return np.ascontiguousarray(head.load()[ids], dtype=np.float32)

    source.tensors = [*source.tensors,
                      SourceTensor("mtp.draft_vocab", (len(ids),), lambda: ids.astype(np.float32)),
                      SourceTensor("mtp.draft_head", (len(ids), hidden), draft_rows)]
    return source
