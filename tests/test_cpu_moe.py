"""The CPU backend's MoE block output (Backend::moe_experts through `_testing.cuda.Ops("cpu")`): the routed
experts' weighted sum, alone and with the gated shared expert added in the same op, against a float64 numpy
transcription (out[r] = sum_j w[r, j] down_e(silu(gate_e x[r]) * up_e x[r]) + sigmoid(logit[r]) * shared[r]).

The binding fills the output with NaN before the op: a row the op skips cannot pass. bf16 weights decode
exactly, so the only error is the op's f32 rounding: a few ulps of the largest term, far under RTOL = 1e-5 of the
largest output, while a dropped or ungated shared term moves outputs by their own size (the shared term is drawn
at the routed sum's size).
"""

from __future__ import annotations

import numpy as np
import pytest
from artifact_files import encoded, shape_of, write_artifact
from ninfer import _engine, _testing
from ninfer.artifact.encodings import decode

EXPERTS, HIDDEN, INTER, TOP_K = 5, 37, 45, 3  # odd widths
RTOL = 1e-5


@pytest.fixture(scope="module")
def experts(tmp_path_factory: pytest.TempPathFactory):
    """Stacked bf16 expert weights (gate, up [E, I, H]; down [E, H, I]) and their float64 values."""
    rng = np.random.default_rng()
    shapes = {"gate": (EXPERTS, INTER, HIDDEN), "up": (EXPERTS, INTER, HIDDEN), "down": (EXPERTS, HIDDEN, INTER)}
    tensors = {name: encoded(rng.standard_normal(shape).astype(np.float32) / 4, "bf16") for name, shape in
               shapes.items()}
    art = _engine.Artifact.open(write_artifact(tmp_path_factory.mktemp("moe") / "w.ninfer", tensors))
    values = {name: decode(blobs, enc, shape_of(enc, blobs), group).astype(np.float64)
              for name, (enc, group, blobs) in tensors.items()}
    yield art, values
    art.close()


def routed_reference(x, ids, w, values) -> np.ndarray:
    out = np.zeros((x.shape[0], HIDDEN))
    for r in range(x.shape[0]):
        for j in range(TOP_K):
            e = ids[r, j]
            g, u = values["gate"][e] @ x[r], values["up"][e] @ x[r]
            out[r] += w[r, j] * (values["down"][e] @ (g / (1.0 + np.exp(-g)) * u))
    return out


@pytest.mark.parametrize("rows", [1, 4, 19])
def test_moe_experts_with_and_without_shared_expert(experts, rows):
    art, values = experts
    rng = np.random.default_rng()
    ops = _testing.cuda.Ops("cpu")
    x = rng.standard_normal((rows, HIDDEN)).astype(np.float32)
    ids = np.stack([rng.choice(EXPERTS, TOP_K, replace=False) for _ in range(rows)]).astype(np.int32)
    w = rng.random((rows, TOP_K)).astype(np.float32)
    routed = routed_reference(x.astype(np.float64), ids, w.astype(np.float64), values)
    shared = (rng.standard_normal((rows, HIDDEN)) * np.abs(routed).max()).astype(np.float32)
    logit = (rng.standard_normal(rows) * 3).astype(np.float32)
    gated = routed + shared / (1.0 + np.exp(-logit.astype(np.float64)))[:, None]

    args = (x, rows, HIDDEN, ids, w, TOP_K, art, "gate", "up", "down")
    for got, want, what in ((ops.moe_experts(*args), routed, "routed"),
                            (ops.moe_experts(*args, shared_out=shared, shared_logit=logit), gated, "with shared")):
        assert np.isfinite(got).all(), f"{what}: unwritten outputs"
        err = np.abs(got - want).max()
        assert err <= RTOL * np.abs(want).max(), f"{what}: max error {err:.3g} of max {np.abs(want).max():.3g}"

    with pytest.raises(Exception, match="shared_out and shared_logit"):
        ops.moe_experts(*args, shared_out=shared)
