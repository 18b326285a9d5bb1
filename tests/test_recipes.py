"""Recipes: the built-ins' choices on Qwen3.5 logical names, fallback to bf16, and JSON recipe files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from ninfer.artifact.encodings import encoding_problem
from ninfer.artifact.recipes import BUILTIN_RECIPES, load_recipe
from ninfer.errors import RecipeError

H, V, E, MOE_I = 5120, 248320, 256, 512
# (name, shape) of a Qwen3.5 MoE model's tensors, one of each kind.
TENSORS = {
    "embed": (V, H),
    "lm_head": (V, H),
    "final_norm": (H,),
    "layers.0.input_norm": (H,),
    "layers.0.gdn.in_qkv": (12288, H),
    "layers.0.gdn.in_z": (6144, H),
    "layers.0.gdn.in_a": (48, H),
    "layers.0.gdn.in_b": (48, H),
    "layers.0.gdn.conv": (12288, 4),
    "layers.0.gdn.A_log": (48,),
    "layers.0.gdn.dt_bias": (48,),
    "layers.0.gdn.out_proj": (H, 6144),
    "layers.3.attn.q_proj": (12288, H),
    "layers.3.attn.q_norm": (256,),
    "layers.3.moe.router": (E, H),
    "layers.3.moe.experts_gate": (E, MOE_I, H),
    "layers.3.moe.experts_down": (E, H, MOE_I),
    "layers.3.moe.shared_expert_gate": (1, H),
    "mtp.fc": (H, 2 * H),
    "mtp.layers.0.moe.router": (E, H),
    "visual.blocks.0.attn.qkv.weight": (3456, 1152),
    "visual.blocks.0.norm1.weight": (1152,),
}

EXPECTED = {
    "bf16": {"embed": ("bf16", None), "layers.3.moe.experts_gate": ("bf16", None), "mtp.fc": ("bf16", None)},
    "fp8": {
        "embed": ("bf16", None),
        "lm_head": ("fp8_e4m3", None),
        "layers.0.gdn.in_a": ("fp8_e4m3", None),
        "layers.3.moe.router": ("bf16", None),
        "layers.3.moe.experts_down": ("fp8_e4m3", None),
    },
    "groupwise-int": {
        "embed": ("int8", 64),
        "lm_head": ("int8", 64),
        "layers.0.gdn.in_qkv": ("int4", 128),
        "layers.0.gdn.in_a": ("bf16", None),
        "layers.0.gdn.in_b": ("bf16", None),
        "layers.3.moe.router": ("bf16", None),
        "layers.3.moe.shared_expert_gate": ("bf16", None),
        "mtp.layers.0.moe.router": ("bf16", None),
        "layers.3.moe.experts_down": ("int4", 128),
        "mtp.fc": ("int4", 128),
    },
    "nvfp4": {
        "embed": ("bf16", None),
        "lm_head": ("fp8_e4m3", None),
        "layers.3.attn.q_proj": ("nvfp4", None),
        "layers.3.moe.router": ("bf16", None),
        "layers.3.moe.experts_gate": ("nvfp4", None),
    },
}


@pytest.mark.parametrize("recipe_name", BUILTIN_RECIPES)
def test_builtin_choices(recipe_name: str):
    recipe = load_recipe(recipe_name)
    for name, shape in TENSORS.items():
        encoding, group = recipe.plan(name, shape)
        assert encoding_problem(encoding, shape, group) is None, name
        if name.startswith("visual."):
            assert encoding == "bf16", name
        elif len(shape) == 1 or name.endswith("gdn.conv"):
            assert encoding == "f32", name
    for name, choice in EXPECTED[recipe_name].items():
        assert recipe.plan(name, TENSORS[name]) == choice, name


def test_auto_group_is_the_largest_that_divides_cols():
    recipe = load_recipe("groupwise-int")
    assert recipe.plan("layers.0.mlp.down", (H, 17408)) == ("int4", 128)
    assert recipe.plan("layers.0.mlp.down", (64, 192)) == ("int4", 64)
    assert recipe.plan("layers.0.mlp.down", (64, 96)) == ("int4", 32)


def test_fallback_to_bf16_warns_once_per_rule_and_problem(caplog):
    recipe = load_recipe("groupwise-int")
    with caplog.at_level(logging.WARNING, logger="ninfer.artifact.recipes"):
        for layer in range(4):
            assert recipe.plan(f"layers.{layer}.mlp.down", (64, 100)) == ("bf16", None)
        assert recipe.plan("embed", (100, 72)) == ("bf16", None)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "layers.0.mlp.down" in messages[0] and "multiple of group_size 32" in messages[0]
    assert "embed" in messages[1] and "group_size 64" in messages[1]


def test_manifest_form_lists_the_resolved_rules():
    manifest = load_recipe("nvfp4").to_json()
    assert manifest["name"] == "nvfp4"
    assert {"pattern": "lm_head", "encoding": "fp8_e4m3"} in manifest["rules"]
    assert manifest["rules"][-1] == {"pattern": "*", "encoding": "nvfp4"}
    json.dumps(manifest)


def write_recipe(tmp_path: Path, spec) -> str:
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(spec))
    return str(path)


def test_json_recipe_rules_come_first_then_the_base(tmp_path: Path):
    recipe = load_recipe(
        write_recipe(
            tmp_path,
            {
                "name": "mix",
                "base": "fp8",
                "rules": [
                    {"pattern": "layers.*.mlp.*", "encoding": "int8", "group_size": 64},
                    {"pattern": "layers.1?.*", "encoding": "bf16"},
                    {"pattern": "layers.*.mlp.up", "encoding": "nvfp4"},
                ],
            },
        )
    )
    assert recipe.name == "mix"
    assert recipe.plan("layers.3.mlp.up", (H, 17408)) == ("int8", 64)  # first match wins
    assert recipe.plan("layers.12.attn.o_proj", (H, H)) == ("bf16", None)
    assert recipe.plan("layers.3.attn.o_proj", (H, H)) == ("fp8_e4m3", None)  # the base
    assert recipe.plan("embed", (V, H)) == ("bf16", None)
    assert recipe.plan("final_norm", (H,)) == ("f32", None)


def test_json_recipe_defaults(tmp_path: Path):
    recipe = load_recipe(write_recipe(tmp_path, {"rules": [{"pattern": "*.attn.*", "encoding": "int4"}]}))
    assert recipe.name == "mix"
    assert recipe.plan("layers.3.attn.k_proj", (1024, 320)) == ("int4", 64)
    assert recipe.plan("layers.3.mlp.up", (H, 17408)) == ("bf16", None)  # base bf16


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            {"rules": [{"pattern": "a", "encoding": "fp8_e4m3"}, {"pattern": "*.mlp.*", "encoding": "int3"}]},
            "rule 1 (pattern '*.mlp.*'): unknown encoding 'int3'",
        ),
        (
            {"rules": [{"pattern": "*.mlp.*", "encoding": "int4", "group_size": 48}]},
            "rule 0 (pattern '*.mlp.*'): group_size must be 32, 64 or 128, not 48",
        ),
        ({"rules": [{"pattern": "x", "encoding": "int4", "group_size": 64.0}]}, "group_size must be"),
        (
            {"rules": [{"pattern": "x", "encoding": "fp8_e4m3", "group_size": 64}]},
            "applies only to int8/int4",
        ),
        ({"rules": [{"pattern": "x", "encoding": "bf16", "ndims": 1}]}, "unknown key(s) ['ndims']"),
        ({"rules": [{"encoding": "bf16"}]}, "rule 0: expected an object with a string 'pattern'"),
        ({"base": "fp4"}, "base 'fp4' is not a built-in"),
        ({"rule": []}, "unknown key(s) ['rule']"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_json_recipes_name_the_file_and_rule(tmp_path: Path, spec, problem: str):
    path = write_recipe(tmp_path, spec)
    with pytest.raises(RecipeError) as refusal:
        load_recipe(path)
    assert path in str(refusal.value) and problem in str(refusal.value)


def test_unknown_recipe_and_unparsable_file(tmp_path: Path):
    with pytest.raises(RecipeError, match="unknown recipe 'int2': not a built-in"):
        load_recipe("int2")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(RecipeError, match="cannot read it as JSON"):
        load_recipe(str(bad))
