"""What a request with `report_progress` must see, whatever the backend: the runtime tests (CPU) and the GPU tests
share it."""

from __future__ import annotations

import math

from ninfer.engine import GenerationEvent


def check_progress(events: list[GenerationEvent], n_prompt: int, chunk: int) -> None:
    """ceil(n / chunk) progress events, processed growing chunk by chunk to n, every one before the first token."""
    n_reports = math.ceil(n_prompt / chunk)
    reports, rest = events[:n_reports], events[n_reports:]
    assert all(ev.progress is not None and ev.token_ids == () and ev.finish_reason is None for ev in reports)
    assert [ev.progress.processed for ev in reports] == [min((i + 1) * chunk, n_prompt) for i in range(n_reports)]
    assert {(ev.progress.total, ev.progress.cached) for ev in reports} == {(n_prompt, 0)}
    elapsed = [ev.progress.elapsed_s for ev in reports]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0
    assert all(ev.progress is None for ev in rest)
    assert rest[0].token_ids and rest[-1].finish_reason is not None
