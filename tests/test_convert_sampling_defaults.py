"""`ninfer convert` stores the source's recommended sampling values in the artifact (`frontend.generation_defaults`),
and the server's layered defaults read them (issue 19, item 1).

- GGUF: a real file written by the `gguf` package's own GGUFWriter (a complete one-layer llama) with llama.cpp's
  `general.sampling.*` keys, written by GGUFWriter's own `add_sampling_*` methods (float32 values, as in the file).
- HF: the tiny llama checkpoint with a generation_config.json written by transformers' GenerationConfig.save_pretrained.

Each artifact is then served (ninfer.serve.state.ServedModel, what /props and every request use): the file's values
win over llama.cpp's defaults, what the file leaves out is llama.cpp's, and a router config's `sampling` wins over
the file. Values the engine cannot run are refused at conversion, naming the key; what it has no sampler for
(mirostat, a stage it lacks) is left out with a warning.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from ninfer.artifact.convert import convert
from ninfer.artifact.reader import read_artifact
from ninfer.engine import Engine, EngineOptions
from ninfer.errors import ConversionError
from ninfer.frontend.sampling_defaults import LLAMA_CPP_DEFAULTS
from ninfer.serve.state import ServedModel


def f32(x: float) -> float:
    """What a GGUF file holds of a float (float32)."""
    return float(np.float32(x))


# llama.cpp's names (gguf-py's GGUFWriter.add_sampling_<name>) -> value; and what the artifact carries for them
GGUF_SAMPLING = {"temp": 0.6, "top_k": 30, "top_p": 0.9, "min_p": 0.02, "xtc_probability": 0.25,
                 "xtc_threshold": 0.2, "penalty_last_n": 128, "penalty_repeat": 1.1,
                 "sequence": "penalties;top_k;top_p;min_p;temperature"}
CARRIED = {"temperature": f32(0.6), "top_k": 30, "top_p": f32(0.9), "min_p": f32(0.02),
           "xtc_probability": f32(0.25), "xtc_threshold": f32(0.2), "penalty_last_n": 128,
           "repetition_penalty": f32(1.1), "order": ["penalties", "top_k", "top_p", "min_p", "temperature"]}


def tiny_llama_gguf(path: Path, sampling: dict[str, object]) -> Path:
    """A complete one-layer llama GGUF (random weights, a six-token BPE vocabulary) with these sampling keys."""
    import gguf

    rng = np.random.default_rng(0)
    hidden, ff, vocab = 8, 16, 6
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(hidden)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_feed_forward_length(ff)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_context_length(64)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab", "<s>", "</s>", "c"])
    writer.add_token_merges(["a b"])
    writer.add_eos_token_id(4)
    for name, value in sampling.items():
        getattr(writer, f"add_sampling_{name}")(value)
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,),
              "blk.0.attn_norm.weight": (hidden,), "blk.0.ffn_norm.weight": (hidden,),
              **{f"blk.0.attn_{p}.weight": (hidden, hidden) for p in ("q", "k", "v", "output")},
              "blk.0.ffn_gate.weight": (ff, hidden), "blk.0.ffn_up.weight": (ff, hidden),
              "blk.0.ffn_down.weight": (hidden, ff)}
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def generation_defaults(artifact: Path) -> dict:
    with read_artifact(artifact) as opened:
        return opened.frontend["generation_defaults"]


def served_defaults(artifact: Path, override: dict | None = None) -> dict:
    """The sampling values a request that sets none gets from the server, by field."""
    with Engine.open_sync(artifact, EngineOptions(max_context=64, max_concurrency=1)) as engine:
        served = ServedModel("m", engine, sampling_override=override or {})
        return vars(served.sampling_defaults(thinking=True))


def test_a_gguf_files_sampling_keys_are_carried_and_served(tmp_path):
    source = tiny_llama_gguf(tmp_path / "s.gguf", GGUF_SAMPLING)
    artifact = convert(source, tmp_path / "s.ninfer", progress=False)
    assert generation_defaults(artifact) == CARRIED
    served = served_defaults(artifact)
    assert {k: served[k] for k in CARRIED} == {**CARRIED, "order": tuple(CARRIED["order"])}
    # A router config's per-model `sampling` still wins over the file.
    assert served_defaults(artifact, {"temperature": 0.3, "top_k": 5})["top_k"] == 5


def test_a_gguf_without_sampling_keys_gets_llama_cpps_defaults(tmp_path):
    artifact = convert(tiny_llama_gguf(tmp_path / "n.gguf", {}), tmp_path / "n.ninfer", progress=False)
    assert generation_defaults(artifact) == {}
    served = served_defaults(artifact)
    assert {k: served[k] for k in LLAMA_CPP_DEFAULTS} == LLAMA_CPP_DEFAULTS and served["order"] == ()


def test_a_partial_gguf_keeps_llama_cpps_defaults_for_the_rest(tmp_path):
    artifact = convert(tiny_llama_gguf(tmp_path / "p.gguf", {"top_k": 7}), tmp_path / "p.ninfer", progress=False)
    served = served_defaults(artifact)
    assert served["top_k"] == 7
    assert {k: served[k] for k in ("temperature", "top_p", "min_p")} == {"temperature": 0.8, "top_p": 0.95,
                                                                        "min_p": 0.05}


@pytest.mark.parametrize(("sampling", "key"), [({"temp": -1.0}, "general.sampling.temp"),
                                               ({"top_p": 1.5}, "general.sampling.top_p"),
                                               ({"top_k": -3}, "general.sampling.top_k"),
                                               ({"penalty_repeat": 0.0}, "general.sampling.penalty_repeat")])
def test_a_gguf_value_the_engine_cannot_run_is_refused_naming_the_key(tmp_path, sampling, key):
    source = tiny_llama_gguf(tmp_path / "bad.gguf", sampling)
    with pytest.raises(ConversionError) as refused:
        convert(source, tmp_path / "bad.ninfer", progress=False)
    assert key in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "bad.ninfer").exists()


def test_what_the_engine_has_no_sampler_for_is_left_out_with_a_warning(tmp_path, caplog):
    sampling = {"temp": 0.5, "mirostat": 2, "mirostat_tau": 5.0, "sequence": "top_k;infill;temperature"}
    artifact = convert(tiny_llama_gguf(tmp_path / "m.gguf", sampling), tmp_path / "m.ninfer", progress=False)
    assert generation_defaults(artifact) == {"temperature": 0.5}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("general.sampling.mirostat = 2" in w for w in warnings), warnings
    assert any("general.sampling.sequence" in w and "infill" in w for w in warnings), warnings


def _with_generation_config(tiny_llama: Path, folder: Path, **values) -> Path:
    from transformers import GenerationConfig

    shutil.copytree(tiny_llama, folder)
    (folder / "generation_config.json").unlink(missing_ok=True)
    GenerationConfig(**values).save_pretrained(folder)
    return folder


def test_an_hf_generation_config_is_carried_and_served(tiny_llama, tmp_path):
    values = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 30, "repetition_penalty": 1.05}
    source = _with_generation_config(tiny_llama, tmp_path / "hf", **values)
    assert json.loads((source / "generation_config.json").read_text())["temperature"] == 0.6  # save_pretrained's
    artifact = convert(source, tmp_path / "hf.ninfer", progress=False)
    carried = {k: v for k, v in values.items() if k != "do_sample"}
    assert generation_defaults(artifact) == carried
    served = served_defaults(artifact)
    assert {k: served[k] for k in carried} == carried and served["min_p"] == LLAMA_CPP_DEFAULTS["min_p"]


def test_an_hf_value_the_engine_cannot_run_is_refused_naming_the_file(tiny_llama, tmp_path):
    source = _with_generation_config(tiny_llama, tmp_path / "hf", do_sample=True, temperature=0.7)
    config = json.loads((source / "generation_config.json").read_text())
    (source / "generation_config.json").write_text(json.dumps({**config, "top_k": 2.5}))
    with pytest.raises(ConversionError) as refused:
        convert(source, tmp_path / "hf.ninfer", progress=False)
    assert "generation_config.json: top_k = 2.5 is not an integer" in str(refused.value)
