"""The CPU linear kernel (`_engine.kernels.linear`) for every weight encoding, against its obviously-right twin
`x @ decode(W).T` (numpy, float64) on fresh random inputs, plus an exactness check of the in-kernel decoders."""

from __future__ import annotations

import numpy as np
import pytest
from artifact_files import encoded, random_codes, shape_of, write_artifact
from ninfer import _engine
from ninfer.artifact.encodings import decode
from ninfer.errors import ArtifactError, EngineError

ROWS = (1, 2, 3, 4, 7, 64, 257)
# (encoding, group_size, out, cols): odd output counts pad the last 4-row tile; cols past 512 cross a decode
# chunk; odd cols where the encoding allows exercise the scalar tails.
WEIGHTS = [
    ("f32", None, 7, 37),
    ("f16", None, 5, 515),
    ("bf16", None, 13, 577),
    ("fp8_e4m3", None, 9, 1031),
    ("fp8_e4m3", None, 4, 8),
    ("int8", 32, 11, 544),
    ("int8", 64, 6, 192),
    ("int8", 128, 3, 1152),
    ("int4", 32, 13, 576),
    ("int4", 64, 5, 1088),
    ("int4", 128, 9, 128),
    ("int4_affine", 32, 13, 576),
    ("int4_affine", 64, 6, 1088),
    ("int4_affine", 128, 3, 128),
    ("nvfp4", None, 7, 48),
    ("nvfp4", None, 10, 528),
]


def weight_id(case: tuple) -> str:
    encoding, group, out, cols = case
    return f"{encoding}{'-g' + str(group) if group else ''}-{out}x{cols}"


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory):
    """One artifact holding every case twice: arbitrary finite codes, and the encoder's output of real values."""
    rng = np.random.default_rng(2024)
    tensors = {}
    for case in WEIGHTS:
        encoding, group, out, cols = case
        tensors["codes/" + weight_id(case)] = random_codes(rng, encoding, (out, cols), group, nan_codes=False)
        tensors["real/" + weight_id(case)] = encoded(rng.standard_normal((out, cols)).astype(np.float32), encoding,
                                                      group)
    tensors["stack"] = random_codes(rng, "int4", (3, 6, 64), 32)
    tensors["stack_affine"] = random_codes(rng, "int4_affine", (3, 6, 64), 32)
    path = write_artifact(tmp_path_factory.mktemp("linear") / "w.ninfer", tensors)
    art = _engine.Artifact.open(path)
    reference = {name: decode(blobs, enc, shape_of(enc, blobs), group) for name, (enc, group, blobs) in tensors.items()}
    yield art, reference
    art.close()


def linear_poisoned(art, name: str, x: np.ndarray, bias: np.ndarray | None = None, matrix: int | None = None):
    """linear() into an output filled with NaN first, so an element the kernel skips cannot pass."""
    out_features = art.tensor_info(name)["shape"][-2]
    out = np.full((x.shape[0], out_features), np.nan, dtype=np.float32)
    result = _engine.kernels.linear(x, art, name, bias=bias, matrix=matrix, out=out)
    assert result is out or np.shares_memory(result, out)
    return out


def check_close(y: np.ndarray, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> None:
    """Within f32 accumulation error of the float64 product: |err| <= cols * eps * (|x| @ |W|.T) per element
    (the classical bound for any summation order), and the typical error far inside it."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    exact = x64 @ w64.T + (0 if bias is None else bias.astype(np.float64))
    magnitude = np.abs(x64) @ np.abs(w64).T + (0 if bias is None else np.abs(bias))
    bound = (x.shape[1] + 2) * np.finfo(np.float32).eps * magnitude
    assert np.isfinite(y).all()
    err = np.abs(y - exact)
    assert (err <= bound).all(), f"max err {err.max()} (bound there {bound.flat[err.argmax()]})"
    assert np.median(err / np.maximum(magnitude, 1e-30)) < 1e-5


@pytest.mark.parametrize("case", WEIGHTS, ids=weight_id)
@pytest.mark.parametrize("kind", ["codes", "real"])
def test_linear_matches_reference(weights, case: tuple, kind: str) -> None:
    art, reference = weights
    name = f"{kind}/{weight_id(case)}"
    w = reference[name]
    rng = np.random.default_rng()  # fresh inputs on every run
    for rows in ROWS:
        x = rng.standard_normal((rows, w.shape[1])).astype(np.float32)
        check_close(linear_poisoned(art, name, x), x, w)


@pytest.mark.parametrize("case", WEIGHTS, ids=weight_id)
def test_each_row_is_independent_of_the_batch(weights, case: tuple) -> None:
    """Batch invariance: a row's output is bit-identical whether it is computed alone or beside other rows, so a
    sequence decodes the same tokens alone or sharing a decode batch (the runtime's concurrency guarantee)."""
    art, reference = weights
    name = f"real/{weight_id(case)}"
    rng = np.random.default_rng()
    x = rng.standard_normal((9, reference[name].shape[1])).astype(np.float32)
    together = linear_poisoned(art, name, x)
    for rows in (1, 2, 3, 9):
        for start in range(0, 9 - rows + 1, rows):
            alone = linear_poisoned(art, name, x[start:start + rows])
            np.testing.assert_array_equal(alone, together[start:start + rows])


@pytest.mark.parametrize("case", WEIGHTS, ids=weight_id)
def test_in_kernel_decode_is_exact(weights, case: tuple) -> None:
    """x = I picks single weights out with no rounding in the sums, so linear(I) must equal decode(W).T bit for
    bit: the kernel's SIMD decoders agree exactly with the reference."""
    art, reference = weights
    name = "codes/" + weight_id(case)
    w = reference[name]
    eye = np.eye(w.shape[1], dtype=np.float32)
    np.testing.assert_array_equal(linear_poisoned(art, name, eye), w.T)


@pytest.mark.parametrize("name", ["stack", "stack_affine"])
def test_bias_and_stacked_matrices(weights, name: str) -> None:
    art, reference = weights
    rng = np.random.default_rng()
    stack = reference[name]
    for index in range(stack.shape[0]):
        x = rng.standard_normal((3, 64)).astype(np.float32)
        bias = rng.standard_normal(6).astype(np.float32)
        check_close(linear_poisoned(art, name, x, bias=bias, matrix=index), x, stack[index], bias)
    fresh = _engine.kernels.linear(x, art, name, matrix=1)  # the allocating form
    check_close(fresh, x, stack[1])


def test_shape_mismatches_are_refused(weights) -> None:
    art, _ = weights
    name = "real/" + weight_id(WEIGHTS[0])
    with pytest.raises(EngineError, match="do not fit weight"):
        _engine.kernels.linear(np.zeros((2, 36), np.float32), art, name)
    with pytest.raises(EngineError, match="do not fit weight"):
        _engine.kernels.linear(np.zeros((2, 37), np.float32), art, name, bias=np.zeros(3, np.float32))
    with pytest.raises(EngineError, match=r"stack of shape \[6, 64\] \(3-D\)"):
        _engine.kernels.linear(np.zeros((2, 64), np.float32), art, "stack")
    with pytest.raises(ArtifactError, match="has no matrix 3"):
        _engine.kernels.linear(np.zeros((2, 64), np.float32), art, "stack", matrix=3)


def test_rows_zero(weights) -> None:
    art, _ = weights
    name = "real/" + weight_id(WEIGHTS[-2])
    assert _engine.kernels.linear(np.zeros((0, 48), np.float32), art, name).shape == (0, 7)

