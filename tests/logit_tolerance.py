"""How close the CPU engine's logits must be to HF transformers' run on the same weights (max |engine - HF| over
max |logit|).

F32_TOL: only the order of f32 sums differs. INT16_TOL: the artifact has int4 / int8 / int4_affine linears and this
build rounds their inputs to int16 per 32 columns (cpp/backend/cpu/linear_int16.h: at most 2^-15 of a block's
largest value). That rounding alone moves HF's own logits by 4.2e-4 on the tiny dense Qwen3.5 (HF with the same
rounding put before each nn.Linear, session 11); the engine against plain HF measured 2.3e-4 to 3.9e-4 on the
Qwen3.5 GGUF, GPTQ and compressed-tensors imports."""

from __future__ import annotations

from pathlib import Path

from ninfer import _engine, _testing

F32_TOL = 1e-4
INT16_TOL = 1e-3


def logit_tolerance(artifact: Path) -> float:
    """INT16_TOL when any weight of `artifact` takes the int16-activation linears in this build, else F32_TOL."""
    with _engine.Artifact.open(str(artifact)) as art:
        rounds = any(_testing.kernels.int16_activations(art, name) for name in art.tensor_names())
    return INT16_TOL if rounds else F32_TOL
