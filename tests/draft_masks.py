"""Test-side token constraints for speculative decoding of constrained requests (DraftTokenConstraint): a stand-in
grammar whose masks are a function of the token history, and a pass-through that counts grammar rejections. Used by
the CPU tests (tests/runtime/test_speculative_constrained.py) and the CUDA ones (tests/gpu/test_cuda_speculative.py)."""

from __future__ import annotations

import numpy as np


def allows(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


class HistoryMasks:
    """A stand-in grammar: the mask at a position is a random half of the vocabulary drawn from the whole token
    history before it (so a draft row's mask is exactly the one plain decoding meets there), and one position in
    five is unconstrained. Asked for draft rows, it stops at a draft its mask forbids (counted in `forbidden`) and,
    now and then, for no reason (a caller that cannot speak for later rows)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.history: list[int] = []
        self.forbidden = 0
        self.rows_given = 0
        self.cut = np.random.default_rng(seed + 1)

    def _mask(self, history: list[int], mask: np.ndarray) -> bool:
        rng = np.random.default_rng([self.seed, len(history), *history])
        if rng.random() < 0.2:
            return False
        mask[:] = rng.integers(0, 1 << 32, size=mask.size, dtype=np.uint32)
        return True

    def fill_next_mask(self, new_token_ids, mask):
        self.history += list(new_token_ids)
        return self._mask(self.history, mask)

    def fill_draft_masks(self, new_token_ids, drafts, masks):
        self.history += list(new_token_ids)
        rows = []
        for i in range(len(drafts) + 1):
            rows.append(self._mask(self.history + list(drafts[:i]), masks[i]))
            if i == len(drafts):
                break
            if rows[-1] and not allows(masks[i], drafts[i]):
                self.forbidden += 1
                break
            if self.cut.random() < 0.1:
                break
        self.rows_given += len(rows)
        return rows


class CountingConstraint:
    """Passes a constraint through, counting the rounds its draft rows stopped at a draft the last row's mask
    forbids (a rejection by the grammar: the round's correction is drawn under that mask)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.forbidden = 0
        self.rounds = 0

    def fill_next_mask(self, new_token_ids, mask):
        return self.inner.fill_next_mask(new_token_ids, mask)

    def fill_draft_masks(self, new_token_ids, drafts, masks):
        rows = self.inner.fill_draft_masks(new_token_ids, drafts, masks)
        self.rounds += 1
        last = len(rows) - 1
        if last < len(drafts) and rows[last] and not allows(masks[last], drafts[last]):
            self.forbidden += 1
        return rows
