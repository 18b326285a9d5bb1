"""The CPU linear kernel (`_testing.kernels.linear`) for every weight encoding, against its obviously-right twin
`x @ decode(W).T` (numpy, float64) on fresh random inputs, plus an exactness check of the in-kernel decoders.
For int4 / int8 / int4_affine the engine's path rounds x to int16 per 32-column block (linear_int16.h): those
cases are held to that rounding's bound, and compared with the f32 kernels (path="f32"), their twin. That kernel
has an AVX-512 form (path="fast" where built) and an AVX2 one (path="avx2"): both are held to the same checks, and
to each other."""

from __future__ import annotations

import numpy as np
import pytest
from artifact_files import encoded, random_codes, shape_of, write_artifact
from ninfer import _engine, _testing
from ninfer.artifact.encodings import decode
from ninfer.errors import ArtifactError, EngineError

ROWS = (1, 2, 3, 4, 7, 64, 257)
INT16_ENCODINGS = ("int8", "int4", "int4_affine")  # what linear_int16 takes (groups of 32, 64, 128)
INT16_FORMS = ("fast", "avx2")  # linear_int16's AVX-512 form where built (else AVX2), and its AVX2 form
# (encoding, group_size, out, cols): odd output counts pad the last 4-row tile; cols past 512 cross a decode
# chunk; odd cols where the encoding allows exercise the scalar tails; an odd count of 32-column blocks in a chunk
# (544, 608, 96) leaves the AVX-512 form a block without a pair.
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
    ("int4", 32, 6, 608),
    ("int4", 64, 5, 1088),
    ("int4", 128, 9, 128),
    ("int4_affine", 32, 13, 576),
    ("int4_affine", 32, 7, 96),
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
    # The int16 kernel sums code * scale and the offset apart: its f32 rounding is relative to both.
    magnitude = {name: int16_magnitude(*triple) for name, triple in tensors.items() if triple[0] in INT16_ENCODINGS}
    yield art, reference, magnitude
    art.close()


def int16_magnitude(encoding: str, group: int, blobs: dict[str, np.ndarray]) -> np.ndarray:
    """|code * scale| + |offset| per weight, the offset being int4_affine's or -zero * scale (int4 / int8)."""
    shape = shape_of(encoding, blobs)
    scale = np.abs(blobs["scale"])
    if encoding == "int4_affine":
        return decode({**blobs, "scale": scale, "offset": np.abs(blobs["offset"])}, encoding, shape, group)
    no_zero = np.zeros_like(blobs["zero"])
    codes_times_scale = decode({**blobs, "scale": scale, "zero": no_zero}, encoding, shape, group)
    minus_zero_times_scale = decode({**blobs, "q": np.zeros_like(blobs["q"]), "scale": scale}, encoding, shape, group)
    return codes_times_scale - minus_zero_times_scale


def int16_kernel(art, name: str) -> bool:
    """Whether path="fast" rounds x to int16 for this weight (linear_int16_applies)."""
    return _testing.kernels.int16_activations(art, name)


def linear_poisoned(art, name: str, x: np.ndarray, bias: np.ndarray | None = None, matrix: int | None = None,
                    path: str = "fast"):
    """linear() into an output filled with NaN first, so an element the kernel skips cannot pass."""
    out_features = art.tensor_info(name)["shape"][-2]
    out = np.full((x.shape[0], out_features), np.nan, dtype=np.float32)
    result = _testing.kernels.linear(x, art, name, bias=bias, matrix=matrix, out=out, path=path)
    assert result is out or np.shares_memory(result, out)
    return out


def int16_half_step(x: np.ndarray) -> np.ndarray:
    """An upper bound on |x - x'| per element for linear_int16's rounding: the step is the least power of two
    with max|block| / step <= 32767.5, so half a step is at most max|block| / 32767 (32-column blocks)."""
    blocks = np.abs(x.astype(np.float64)).reshape(x.shape[0], -1, 32)
    return np.repeat(blocks.max(axis=2) / 32767, 32, axis=1)


def error_bound(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None,
                int16_magnitude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 product, the bound on a kernel's error against it). The f32 kernels: cols * eps * (|x| @ |W|.T)
    (the classical bound for any summation order). The int16 kernel (int16_magnitude given): it computes x' @ W.T
    for x' = x rounded, so its bound is the rounding's |x - x'| @ |W|.T plus the classical bound of x' with the
    magnitudes its sums hold."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    exact = x64 @ w64.T + (0 if bias is None else bias.astype(np.float64))
    bias_magnitude = 0 if bias is None else np.abs(bias)
    gamma = (x.shape[1] + 2) * np.finfo(np.float32).eps
    if int16_magnitude is None:
        return exact, gamma * (np.abs(x64) @ np.abs(w64).T + bias_magnitude)
    half_step = int16_half_step(x)
    rounding = half_step @ np.abs(w64).T
    return exact, rounding + gamma * ((np.abs(x64) + half_step) @ int16_magnitude.astype(np.float64).T + bias_magnitude)


def check_close(y: np.ndarray, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None,
                int16_magnitude: np.ndarray | None = None) -> None:
    """Within error_bound of the float64 product, and the typical error far inside the bound: for f32, 1e-5 of
    |x| @ |W|.T; for int16 activations 1e-4 (8-bit rounding, what moved the default model's answers, has 256x the
    int16 rounding's steps)."""
    exact, bound = error_bound(x, w, bias, int16_magnitude)
    assert np.isfinite(y).all()
    err = np.abs(y - exact)
    assert (err <= bound).all(), f"max err {err.max()} (bound there {bound.flat[err.argmax()]})"
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    typical = 1e-5 if int16_magnitude is None else 1e-4
    assert np.median(err / np.maximum(magnitude, 1e-30)) < typical


@pytest.mark.parametrize("case", WEIGHTS, ids=weight_id)
@pytest.mark.parametrize("kind", ["codes", "real"])
def test_linear_matches_reference(weights, case: tuple, kind: str) -> None:
    art, reference, magnitude = weights
    name = f"{kind}/{weight_id(case)}"
    w = reference[name]
    rng = np.random.default_rng()  # fresh inputs on every run
    for rows in ROWS:
        x = rng.standard_normal((rows, w.shape[1])).astype(np.float32)
        for path in INT16_FORMS:
            fast = linear_poisoned(art, name, x, path=path)
            check_close(fast, x, w, int16_magnitude=magnitude[name] if int16_kernel(art, name) else None)
        check_close(linear_poisoned(art, name, x, path="f32"), x, w)


def block_scaled_inputs(shape: tuple[int, int]):
    """(x, bias) for each of ROWS: fresh random rows whose 32-column blocks differ in scale by up to 2^24."""
    rng = np.random.default_rng()
    for rows in ROWS:
        block_scale = np.exp2(rng.integers(-12, 13, (rows, shape[1] // 32)))
        x = (rng.standard_normal((rows, shape[1])) * np.repeat(block_scale, 32, axis=1)).astype(np.float32)
        yield x, rng.standard_normal(shape[0]).astype(np.float32)


@pytest.mark.parametrize("path", INT16_FORMS)
@pytest.mark.parametrize("case", [c for c in WEIGHTS if c[0] in INT16_ENCODINGS], ids=weight_id)
def test_int16_kernel_against_its_f32_twin(weights, case: tuple, path: str) -> None:
    """linear_int16 against the f32 kernels and float64 on inputs whose 32-column blocks differ in scale by up to
    2^24 (a kernel with one step per row, not per block, fails the bound on the small blocks)."""
    art, reference, magnitude = weights
    name = f"real/{weight_id(case)}"
    if not int16_kernel(art, name):
        pytest.skip("this build has no int16 kernel (needs AVX2, F16C and FMA: built without -march=native?)")
    w = reference[name]
    for x, bias in block_scaled_inputs(w.shape):
        fast = linear_poisoned(art, name, x, bias=bias, path=path)
        twin = linear_poisoned(art, name, x, bias=bias, path="f32")
        _, fast_bound = error_bound(x, w, bias, magnitude[name])
        _, twin_bound = error_bound(x, w, bias)
        check_close(fast, x, w, bias, magnitude[name])
        assert (np.abs(fast - twin) <= fast_bound + twin_bound).all()
        assert not np.array_equal(fast, twin)  # the path really differs: x was rounded


@pytest.mark.parametrize("case", [c for c in WEIGHTS if c[0] in INT16_ENCODINGS], ids=weight_id)
def test_int16_forms_differ_by_f32_rounding_order_only(weights, case: tuple) -> None:
    """The AVX-512 and the AVX2 forms round x the same way and take the same exact int32 block sums; they only
    order (and group) the f32 work differently. So their difference is within twice the f32 part of the bound
    (gamma * the sums' magnitudes), with no share of the int16 rounding's: and typically far inside it, at f32
    rounding level (measured: medians 2e-8 to 9e-8 of |x| @ |W|.T; held under 5e-7), where a different rounding of
    x shows as 2e-6 to 5e-6 (as the f32 twin, whose x is not rounded at all, shows: held 10x above)."""
    art, reference, magnitude = weights
    name = f"real/{weight_id(case)}"
    if not _testing.kernels.int16_avx512():
        pytest.skip("this build has no AVX-512 form of the int16 kernel: path fast is the AVX2 form")
    w = reference[name]
    for x, bias in block_scaled_inputs(w.shape):
        wide = linear_poisoned(art, name, x, bias=bias).astype(np.float64)
        avx2 = linear_poisoned(art, name, x, bias=bias, path="avx2").astype(np.float64)
        unrounded = linear_poisoned(art, name, x, bias=bias, path="f32").astype(np.float64)
        gamma = (x.shape[1] + 2) * np.finfo(np.float32).eps
        x_magnitude = np.abs(x.astype(np.float64)) + int16_half_step(x)
        f32_part = gamma * (x_magnitude @ magnitude[name].astype(np.float64).T + np.abs(bias))
        assert (np.abs(wide - avx2) <= 2 * f32_part).all()
        relative = np.abs(wide - avx2) / np.maximum(np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T,
                                                    1e-30)
        assert np.median(relative) < 5e-7, f"median {np.median(relative)}"
        rounding = np.abs(avx2 - unrounded) / np.maximum(np.abs(x.astype(np.float64)) @ np.abs(w.T), 1e-30)
        assert np.median(rounding) > 10 * np.median(relative)  # the check above would see a change of rounding


def test_int16_kernel_applies_to_grouped_integers_only(weights) -> None:
    art, _, _ = weights
    applies = {case[0]: int16_kernel(art, "real/" + weight_id(case)) for case in WEIGHTS}
    if not any(applies.values()):
        pytest.skip("this build has no int16 kernel (needs AVX2, F16C and FMA)")
    assert applies == {encoding: encoding in INT16_ENCODINGS for encoding in applies}


@pytest.mark.parametrize("case", [c for c in WEIGHTS if c[0] in INT16_ENCODINGS], ids=weight_id)
def test_int16_kernel_turns_non_finite_blocks_into_nan(weights, case: tuple) -> None:
    """A NaN or an infinity in an input row makes that row's outputs NaN (it must not round to a finite int16),
    and leaves the other rows alone."""
    art, reference, _ = weights
    name = f"real/{weight_id(case)}"
    rng = np.random.default_rng()
    x = rng.standard_normal((3, reference[name].shape[1])).astype(np.float32)
    x[0, rng.integers(x.shape[1])] = np.nan
    x[2, rng.integers(x.shape[1])] = np.inf
    y = linear_poisoned(art, name, x)
    assert np.isnan(y[0]).all() and np.isfinite(y[1]).all() and not np.isfinite(y[2]).any()


@pytest.mark.parametrize("path", INT16_FORMS)
@pytest.mark.parametrize("case", WEIGHTS, ids=weight_id)
def test_each_row_is_independent_of_the_batch(weights, case: tuple, path: str) -> None:
    """Batch invariance: a row's output is bit-identical whether it is computed alone or beside other rows, so a
    sequence decodes the same tokens alone or sharing a decode batch (the runtime's concurrency guarantee)."""
    art, reference, _ = weights
    name = f"real/{weight_id(case)}"
    rng = np.random.default_rng()
    x = rng.standard_normal((9, reference[name].shape[1])).astype(np.float32)
    together = linear_poisoned(art, name, x, path=path)
    for rows in (1, 2, 3, 9):
        for start in range(0, 9 - rows + 1, rows):
            alone = linear_poisoned(art, name, x[start:start + rows], path=path)
            np.testing.assert_array_equal(alone, together[start:start + rows])


@pytest.mark.parametrize("path", ["fast", "avx2", "f32"])
@pytest.mark.parametrize("case", WEIGHTS, ids=weight_id)
def test_in_kernel_decode_is_exact(weights, case: tuple, path: str) -> None:
    """x = I picks single weights out with no rounding in the sums (the int16 kernel's power-of-two steps hold 1
    exactly), so linear(I) must equal decode(W).T bit for bit: the kernel's SIMD decoders agree exactly with the
    reference."""
    art, reference, _ = weights
    name = "codes/" + weight_id(case)
    w = reference[name]
    eye = np.eye(w.shape[1], dtype=np.float32)
    np.testing.assert_array_equal(linear_poisoned(art, name, eye, path=path), w.T)


@pytest.mark.parametrize("name", ["stack", "stack_affine"])
def test_bias_and_stacked_matrices(weights, name: str) -> None:
    art, reference, magnitude = weights
    rng = np.random.default_rng()
    stack = reference[name]
    int16 = int16_kernel(art, name)
    for index in range(stack.shape[0]):
        x = rng.standard_normal((3, 64)).astype(np.float32)
        bias = rng.standard_normal(6).astype(np.float32)
        check_close(linear_poisoned(art, name, x, bias=bias, matrix=index), x, stack[index], bias,
                    magnitude[name][index] if int16 else None)
    fresh = _testing.kernels.linear(x, art, name, matrix=1)  # the allocating form
    check_close(fresh, x, stack[1], int16_magnitude=magnitude[name][1] if int16 else None)


def test_shape_mismatches_are_refused(weights) -> None:
    art, _, _ = weights
    name = "real/" + weight_id(WEIGHTS[0])
    with pytest.raises(EngineError, match="do not fit weight"):
        _testing.kernels.linear(np.zeros((2, 36), np.float32), art, name)
    with pytest.raises(EngineError, match="do not fit weight"):
        _testing.kernels.linear(np.zeros((2, 37), np.float32), art, name, bias=np.zeros(3, np.float32))
    with pytest.raises(EngineError, match=r"stack of shape \[6, 64\] \(3-D\)"):
        _testing.kernels.linear(np.zeros((2, 64), np.float32), art, "stack")
    with pytest.raises(ArtifactError, match="has no matrix 3"):
        _testing.kernels.linear(np.zeros((2, 64), np.float32), art, "stack", matrix=3)


    with pytest.raises(EngineError, match='path must be "fast", "avx2" or "f32", not "int8"'):
        _testing.kernels.linear(np.zeros((2, 37), np.float32), art, name, path="int8")


def test_rows_zero(weights) -> None:
    art, _, _ = weights
    name = "real/" + weight_id(WEIGHTS[-2])
    assert _testing.kernels.linear(np.zeros((0, 48), np.float32), art, name).shape == (0, 7)



# linear_shared_input sets (encoding, group, out) on one input width: a layer's q/k/v (together past the size at
# which a decode step goes parallel, each alone below it), a gate/up pair, and a mix of group sizes and encodings
# (two int16 groups, and weights that take the f32 kernels beside them).
SHARED_COLS = 576
SHARED_SETS = {
    "qkv": [("int4_affine", 32, 512), ("int4_affine", 32, 128), ("int4_affine", 32, 130)],
    "gate_up": [("int4_affine", 32, 1536), ("int4_affine", 32, 1533)],
    "mixed": [("int4", 32, 13), ("int4_affine", 64, 6), ("f16", None, 5), ("int8", 32, 9), ("int8", 64, 700),
              ("bf16", None, 3)],
}


@pytest.fixture(scope="module")
def shared_weights(tmp_path_factory: pytest.TempPathFactory):
    rng = np.random.default_rng(7)
    tensors = {f"{label}/{i}": encoded(rng.standard_normal((out, SHARED_COLS)).astype(np.float32), encoding, group)
               for label, cases in SHARED_SETS.items() for i, (encoding, group, out) in enumerate(cases)}
    art = _engine.Artifact.open(write_artifact(tmp_path_factory.mktemp("shared") / "w.ninfer", tensors))
    yield art
    art.close()


@pytest.mark.parametrize("path", ["fast", "avx2", "f32"])
@pytest.mark.parametrize("label", list(SHARED_SETS))
def test_shared_input_equals_separate_linears(shared_weights, label: str, path: str) -> None:
    """linear_shared_input (one rounding of x for the int16 weights of one group size, one parallel region for all
    their tiles at rows = 1) gives each weight exactly its own linear() call's output, with and without bias, on
    fresh random inputs; outputs start as NaN, so a tile the shared loop skips cannot pass."""
    art = shared_weights
    names = [f"{label}/{i}" for i in range(len(SHARED_SETS[label]))]
    outs_of = [art.tensor_info(name)["shape"][0] for name in names]
    rng = np.random.default_rng()
    for rows in (1, 2, 3, 7, 64):
        x = (rng.standard_normal((rows, SHARED_COLS)) * rng.uniform(0.01, 100)).astype(np.float32)
        biases = [rng.standard_normal(n).astype(np.float32) if i % 2 == 0 else None for i, n in enumerate(outs_of)]
        outs = [np.full((rows, n), np.nan, np.float32) for n in outs_of]
        got = _testing.kernels.linear_shared_input(x, art, names, outs, biases, path=path)
        assert len(got) == len(names) and all(np.shares_memory(g, o) for g, o in zip(got, outs, strict=True))
        for name, out, bias in zip(names, outs, biases, strict=True):
            alone = linear_poisoned(art, name, x, bias=bias, path=path)
            np.testing.assert_array_equal(out, alone, err_msg=f"{name} rows={rows} path={path}")


def test_cpu_backend_shared_input_equals_separate_linears(shared_weights) -> None:
    """The model's entry point, CpuBackend::linear_shared_input (through the ops binding), is the same call."""
    art, ops = shared_weights, _testing.cuda.Ops("cpu")
    names = [f"qkv/{i}" for i in range(len(SHARED_SETS["qkv"]))] + ["mixed/3", "mixed/2"]
    rng = np.random.default_rng()
    for rows in (1, 5):
        x = rng.standard_normal((rows, SHARED_COLS)).astype(np.float32)
        for name, got in zip(names, ops.linear_shared_input(x, art, names), strict=True):
            np.testing.assert_array_equal(got, linear_poisoned(art, name, x), err_msg=f"{name} rows={rows}")


def test_shared_input_refuses_misfits(shared_weights) -> None:
    art = shared_weights
    x = np.zeros((2, SHARED_COLS), np.float32)
    with pytest.raises(EngineError, match="does not fit weight"):
        _testing.kernels.linear_shared_input(x, art, ["qkv/0"], [np.zeros((2, 511), np.float32)], [None])
    with pytest.raises(EngineError, match="1 weights, 2 outputs, 1 biases"):
        _testing.kernels.linear_shared_input(x, art, ["qkv/0"], [np.zeros((2, 512), np.float32)] * 2, [None])
