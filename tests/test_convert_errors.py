"""Bad sources give typed errors whose message names the problem; the CLI prints them as one line."""

from __future__ import annotations

import json
import shutil

import pytest

from ninfer.artifact.convert import convert
from ninfer.cli.main import main
from ninfer.errors import ConversionError, RecipeError, UnsupportedArchitectureError


def test_unknown_architecture_is_named_with_the_supported_list(tiny_llama, tmp_path):
    folder = tmp_path / "neox"
    shutil.copytree(tiny_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, model_type="gpt_neox")))
    with pytest.raises(UnsupportedArchitectureError, match="'gpt_neox'.*qwen3_5, qwen3_5_moe, llama, qwen2, qwen3"):
        convert(folder, tmp_path / "x.ninfer", progress=False)
    assert not (tmp_path / "x.ninfer").exists()


def test_folder_without_config(tmp_path):
    with pytest.raises(ConversionError, match="no config.json"):
        convert(tmp_path, tmp_path / "x.ninfer", progress=False)


def test_folder_without_weights(tiny_llama, tmp_path):
    shutil.copy(tiny_llama / "config.json", tmp_path / "config.json")
    with pytest.raises(ConversionError, match=r"no \*\.safetensors"):
        convert(tmp_path, tmp_path / "x.ninfer", progress=False)


def test_truncated_safetensors_names_the_file(tiny_llama, tmp_path):
    folder = tmp_path / "cut"
    shutil.copytree(tiny_llama, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ConversionError, match="model.safetensors: not a readable safetensors file"):
        convert(folder, tmp_path / "x.ninfer", progress=False)


def test_unknown_tensor_is_named(tiny_qwen2, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "extra"
    shutil.copytree(tiny_qwen2, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    # A tensor no architecture has, so written by hand into the save_pretrained file.
    tensors["model.layers.0.self_attn.o_proj.bias"] = tensors["model.norm.weight"].clone()
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ConversionError, match=r"model\.layers\.0\.self_attn\.o_proj\.bias"):
        convert(folder, tmp_path / "x.ninfer", progress=False)


def test_not_a_model(tmp_path):
    stray = tmp_path / "notes.txt"
    stray.write_text("hello")
    with pytest.raises(ConversionError, match="not a Hugging Face model folder or a .gguf file"):
        convert(stray, tmp_path / "x.ninfer", progress=False)
    with pytest.raises(ConversionError, match="no such file"):
        convert(tmp_path / "missing", tmp_path / "x.ninfer", progress=False)


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 20)
    with pytest.raises(ConversionError, match="bad.gguf"):
        convert(bad, tmp_path / "x.ninfer", progress=False)


def test_unknown_recipe(tiny_llama, tmp_path):
    with pytest.raises(RecipeError, match="nope"):
        convert(tiny_llama, tmp_path / "x.ninfer", recipe="nope", progress=False)


def test_qwen_template_refused_for_plain_model(tiny_llama, tmp_path):
    with pytest.raises(ConversionError, match="qwen3_8 is for the Qwen3.5 family"):
        convert(tiny_llama, tmp_path / "x.ninfer", template="qwen3_8", progress=False)


def test_cli_prints_one_line_error(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "x.ninfer")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("ninfer: error:") and "no such file" in err


def test_cli_converts(tiny_qwen2, tmp_path, capsys):
    out = tmp_path / "q2.ninfer"
    assert main(["convert", str(tiny_qwen2), str(out), "--recipe", "fp8", "--no-progress"]) == 0
    assert out.exists() and f"wrote {out}" in capsys.readouterr().out
