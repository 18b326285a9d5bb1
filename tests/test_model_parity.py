"""The C++ CPU model against Hugging Face transformers 5.23 (fp32) on tiny random checkpoints.

Every artifact is the bf16 conversion of a checkpoint whose weights are bf16-representable, so the engine
and HF run on identical weights and differ only by f32 rounding order. Tolerances are relative to the logit
scale (max |HF logit|):
- KV f32: max |Δlogit| <= 1e-4 * scale (measured ~1e-5 * scale on Qwen3.5, ~5e-7 * scale on llama).
- KV bf16: keys and values are rounded to 8 significant bits (relative error <= 2^-9 each), which moves
  attention outputs by up to ~0.4 % of their size; through the remaining layers that is a few 1e-3 of the
  logit scale, so the bound is 2e-2 * scale (a wrong head, position or page would be off by the whole scale).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ninfer import _testing
from ninfer.artifact.convert import convert
from ninfer.errors import CapacityError, EngineError
from tiny_models import load_reference_model, load_reference_mtp

F32_KV_TOL = 1e-4
BF16_KV_TOL = 2e-2
ALL_KINDS = ["qwen3_5", "qwen3_5_moe", "llama", "qwen2", "qwen3"]
QWEN35_KINDS = ["qwen3_5", "qwen3_5_moe"]
GREEDY_STEPS = 32


@pytest.fixture(scope="session")
def checkpoints(request) -> dict:
    return {kind: request.getfixturevalue(f"tiny_{kind}") for kind in ALL_KINDS}


@pytest.fixture(scope="session")
def artifacts(pytestconfig, checkpoints) -> dict:
    folder = pytestconfig.cache.mkdir("model-parity-artifacts")
    out = {}
    for kind, src in checkpoints.items():
        path = folder / f"{src.name}.bf16.ninfer"  # checkpoint folders are named by seed and builder version
        if not path.exists():
            convert(src, path, recipe="bf16", progress=False)
        out[kind] = path
    return out


@pytest.fixture(scope="session")
def references(checkpoints) -> dict:
    torch.set_num_threads(2)
    return {kind: load_reference_model(src) for kind, src in checkpoints.items()}


def open_model(artifacts, kind: str, kv_dtype: str = "f32", **options) -> _testing.Model:
    options.setdefault("max_context", 512)
    return _testing.Model.open(str(artifacts[kind]), kv_dtype=kv_dtype, threads=2, **options)


def random_tokens(seed: int, n: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int32)


def assert_close(ours: np.ndarray, ref: np.ndarray, rel_tol: float, what: str) -> None:
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} vs {ref.shape}"
    assert np.isfinite(ours).all(), f"{what}: non-finite values"
    scale = float(np.abs(ref).max())
    err = float(np.abs(ours - ref).max())
    assert err <= rel_tol * scale, f"{what}: max |Δ| {err:.3g} > {rel_tol} * scale {scale:.3g}"


def hf_logits(ref, tokens: np.ndarray, past=None):
    with torch.no_grad():
        out = ref(torch.tensor(tokens[None].astype(np.int64)), past_key_values=past, use_cache=True)
    return out.logits[0].numpy(), out.past_key_values


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_prefill_decode_and_greedy_match_hf(artifacts, references, kind):
    model = open_model(artifacts, kind)
    ref = references[kind]
    vocab = model.config["vocab_size"]
    prompt = random_tokens(1, 13, vocab)
    seq = model.new_sequence()
    ours = model.prefill(seq, prompt, all_logits=True)
    theirs, past = hf_logits(ref, prompt)
    assert_close(ours, theirs, F32_KV_TOL, f"{kind} prefill")

    # Each side continues greedily from its own logits; the tokens must agree and every step's logits match.
    our_tokens, hf_tokens = [], []
    our_next, hf_next = int(ours[-1].argmax()), int(theirs[-1].argmax())
    for step in range(GREEDY_STEPS):
        our_tokens.append(our_next)
        hf_tokens.append(hf_next)
        ours = model.decode(seq, our_next)
        theirs, past = hf_logits(ref, np.array([hf_next]), past)
        assert_close(ours, theirs, F32_KV_TOL, f"{kind} decode step {step}")
        our_next, hf_next = int(ours[-1].argmax()), int(theirs[-1].argmax())
    assert our_tokens == hf_tokens
    assert seq.length == len(prompt) + GREEDY_STEPS


@pytest.mark.parametrize("kind", ["qwen3_5", "llama"])
def test_bf16_kv_within_its_rounding_bound(artifacts, references, kind):
    model = open_model(artifacts, kind, kv_dtype="bf16")
    vocab = model.config["vocab_size"]
    tokens = random_tokens(2, 40, vocab)
    seq = model.new_sequence()
    ours = np.concatenate([model.prefill(seq, tokens[:30], all_logits=True)] +
                          [model.decode(seq, int(t)) for t in tokens[30:]])
    theirs, _ = hf_logits(references[kind], tokens)
    assert_close(ours, theirs, BF16_KV_TOL, f"{kind} bf16 KV")
    # ... and bf16 KV does change something (the f32 path is not silently used).
    exact = open_model(artifacts, kind, kv_dtype="f32")
    assert not np.array_equal(ours[-1], exact.prefill(exact.new_sequence(), tokens)[-1])


# Qwen3.5 (chunked vs recurrent delta rule, conv history across calls) and a plain decoder (KV pages only);
# 66 tokens cross a page and a GDN chunk boundary. The MoE kind shares this path and adds only the FFN.
@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3"])
def test_prefill_chunk_sizes_agree(artifacts, kind):
    model = open_model(artifacts, kind, max_sequences=4)
    vocab = model.config["vocab_size"]
    tokens = random_tokens(3, 66, vocab)
    whole = model.prefill(model.new_sequence(), tokens, all_logits=True)
    for chunk in (1, 7, 64):
        seq = model.new_sequence()
        parts = [model.prefill(seq, tokens[i:i + chunk], all_logits=True)
                 for i in range(0, len(tokens), chunk)]
        assert_close(np.concatenate(parts), whole, 1e-5, f"{kind} chunk {chunk}")
        model.release(seq)


def test_gdn_chunk_length_does_not_change_logits(artifacts):
    tokens = random_tokens(4, 100, 248320)
    results = []
    for chunk in (64, 16, 5):
        model = open_model(artifacts, "qwen3_5", gdn_chunk=chunk)
        results.append(model.prefill(model.new_sequence(), tokens, all_logits=True))
    for chunk, got in zip((16, 5), results[1:]):
        assert_close(got, results[0], 1e-5, f"gdn_chunk {chunk}")


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_5_moe", "llama"])
def test_batched_forward_equals_each_alone(artifacts, kind):
    model = open_model(artifacts, kind, max_sequences=6)
    vocab = model.config["vocab_size"]
    prompts = [random_tokens(10 + i, n, vocab) for i, n in enumerate((5, 17, 70))]
    alone = []
    for p in prompts:
        seq = model.new_sequence()
        first = model.prefill(seq, p, all_logits=True)
        alone.append((first, model.decode(seq, 7)))
    seqs = [model.new_sequence() for _ in prompts]
    batched = model.forward_batch(list(zip(seqs, prompts)), all_logits=True)
    step = model.forward_batch([(s, np.array([7], np.int32)) for s in seqs])
    for i, (first, second) in enumerate(alone):
        assert_close(batched[i], first, 1e-5, f"{kind} batched prefill item {i}")
        assert_close(step[i], second, 1e-5, f"{kind} batched decode item {i}")
        assert seqs[i].length == len(prompts[i]) + 1


@pytest.mark.parametrize("kind", QWEN35_KINDS)
def test_mtp_head_matches_hf_mtp_model(artifacts, checkpoints, references, kind):
    model = open_model(artifacts, kind)
    assert model.has_mtp
    ref = references[kind]
    mtp = load_reference_mtp(checkpoints[kind], ref)
    vocab = model.config["vocab_size"]
    tokens = random_tokens(5, 24, vocab)
    seq = model.new_sequence()
    model.prefill(seq, tokens, all_logits=True)
    hidden = model.hidden
    with torch.no_grad():
        hf_hidden = ref.model(torch.tensor(tokens[None].astype(np.int64))).last_hidden_state
        assert_close(hidden, hf_hidden[0].numpy(), F32_KV_TOL, f"{kind} final hidden")
        n = len(tokens) - 1
        # HF's generic MTP layer: row t combines hidden t with token t + 1; positions are relative (RoPE), so
        # labelling row t with t (ours) or t + 1 (HF's generation loop) gives the same result.
        h = mtp.forward_layer(0, hf_hidden[:, :n], torch.arange(n)[None], None,
                              input_ids=torch.tensor(tokens[None, 1:].astype(np.int64)))
        theirs = mtp._project_to_logits(h)[0].numpy()
    ours = model.mtp_logits(seq, hidden[:n], tokens[1:], 0)
    assert_close(ours, theirs, F32_KV_TOL, f"{kind} MTP logits")

    # The MTP layer's own KV: feeding the rows in two calls gives the same logits as one.
    first = model.mtp_logits(seq, hidden[:9], tokens[1:10], 0)
    rest = model.mtp_logits(seq, hidden[9:n], tokens[10:], 9)
    assert_close(np.concatenate([first, rest]), theirs, F32_KV_TOL, f"{kind} MTP logits in two calls")


@pytest.mark.parametrize("kind", QWEN35_KINDS)
def test_mtp_after_forward_batch_on_a_fresh_sequence_matches_hf(artifacts, checkpoints, references, kind):
    # The call pattern that once gave NaN MTP logits on the MoE artifact: a fresh 9-token sequence through
    # forward_batch, then the MTP head over its first 8 rows at start 0 (and fresh random lengths besides).
    model = open_model(artifacts, kind)
    ref = references[kind]
    mtp = load_reference_mtp(checkpoints[kind], ref)
    vocab = model.config["vocab_size"]
    seed = int(np.random.default_rng().integers(1 << 30))
    for n in (9, *np.random.default_rng(seed).integers(2, 40, 2)):
        tokens = random_tokens(seed + int(n), int(n), vocab)
        seq = model.new_sequence()
        model.forward_batch([(seq, tokens)], all_logits=True)
        rows = int(n) - 1
        ours = model.mtp_logits(seq, np.ascontiguousarray(model.hidden[:rows]), tokens[1:], 0)
        assert np.isfinite(ours).all(), f"{kind} MTP logits not finite (n={n}, seed={seed})"
        with torch.no_grad():
            hf_hidden = ref.model(torch.tensor(tokens[None].astype(np.int64))).last_hidden_state
            h = mtp.forward_layer(0, hf_hidden[:, :rows], torch.arange(rows)[None], None,
                                  input_ids=torch.tensor(tokens[None, 1:].astype(np.int64)))
            theirs = mtp._project_to_logits(h)[0].numpy()
        assert_close(ours, theirs, F32_KV_TOL, f"{kind} MTP logits after forward_batch (n={n}, seed={seed})")
        del seq


@pytest.mark.parametrize("kind", ["qwen3_5", "llama"])
def test_score_matches_hf_log_softmax(artifacts, references, kind):
    model = open_model(artifacts, kind)
    vocab = model.config["vocab_size"]
    tokens = random_tokens(6, 90, vocab)  # longer than one 64-row scoring chunk
    free_before = model.kv_free_tokens()
    ours = model.score(tokens)
    with torch.no_grad():
        logits = references[kind](torch.tensor(tokens[None].astype(np.int64))).logits[0].double()
    targets = torch.tensor(tokens[1:].astype(np.int64))
    theirs = torch.log_softmax(logits, -1)[torch.arange(len(tokens) - 1), targets]
    assert ours.dtype == np.float64 and ours.shape == (len(tokens) - 1,)
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-4 * float(logits.abs().max()), rtol=0)
    assert model.kv_free_tokens() == free_before  # the scoring sequence gave its pages back


@pytest.mark.parametrize("kind", ["qwen3_5", "llama"])
def test_token_out_of_range_is_refused_and_changes_nothing(artifacts, kind):
    model = open_model(artifacts, kind, max_sequences=2)
    vocab = model.config["vocab_size"]
    tokens = random_tokens(7, 10, vocab)
    seq = model.new_sequence()
    model.prefill(seq, tokens)
    pages, length, free = seq.pages, seq.length, model.kv_free_tokens()
    for bad in (vocab, -1, vocab + 12345):
        with pytest.raises(EngineError, match=rf"token id {bad}\b.*{vocab}"):
            model.prefill(seq, np.array([1, 2, bad, 3] * 30, np.int32))
        with pytest.raises(EngineError, match=str(bad)):
            model.decode(seq, bad)
    assert (seq.pages, seq.length, model.kv_free_tokens()) == (pages, length, free)
    # The caches are untouched: the next token's logits equal those of a sequence that never saw the errors.
    after = model.decode(seq, 5)
    clean = model.new_sequence()
    model.prefill(clean, tokens)
    np.testing.assert_array_equal(after, model.decode(clean, 5))


def test_pool_accounting_and_capacity_errors(artifacts):
    model = open_model(artifacts, "qwen3_5", max_context=256, kv_capacity=192, max_sequences=2)
    assert model.kv_capacity_tokens == 192 and model.kv_free_tokens() == 192
    a, b = model.new_sequence(), model.new_sequence()
    model.prefill(a, random_tokens(8, 70, 248320))  # 2 pages
    assert model.kv_free_tokens() == 64 and model.free_state_slots == 1
    with pytest.raises(CapacityError, match="cannot hold 100 tokens"):
        model.prefill(b, random_tokens(9, 100, 248320))
    assert (b.pages, b.state_slot, model.kv_free_tokens(), model.free_state_slots) == (0, -1, 64, 1)
    with pytest.raises(CapacityError, match="max_context"):
        model.prefill(a, random_tokens(9, 200, 248320))
    model.release(a)
    assert model.kv_free_tokens() == 192 and model.free_state_slots == 2 and a.length == 0
    model.prefill(b, random_tokens(9, 100, 248320))
    assert b.pages == 2
