"""Conversion recipes: which encoding each logical tensor gets (docs/artifacts.md explains the built-ins).

A recipe is an ordered list of rules; the first whose fnmatch pattern (and rank, when given) matches a logical
tensor name decides. A JSON recipe file's rules come before those of its base (a built-in, `bf16` by default).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from ninfer.artifact.encodings import ENCODINGS, GROUP_SIZES, GROUPED_ENCODINGS, encoding_problem
from ninfer.errors import RecipeError

log = logging.getLogger(__name__)

FALLBACK_ENCODING = "bf16"


@dataclass(frozen=True)
class Rule:
    pattern: str  # fnmatch over logical names; `*` also matches dots
    encoding: str
    group_size: int | None = None  # grouped encodings only; None = the largest of 128, 64, 32 that divides cols
    ndim: int | None = None  # match only tensors of this rank

    def matches(self, name: str, shape: tuple[int, ...]) -> bool:
        return (self.ndim is None or len(shape) == self.ndim) and fnmatchcase(name, self.pattern)

    def to_json(self) -> dict:
        entry: dict = {"pattern": self.pattern, "encoding": self.encoding}
        if self.group_size is not None:
            entry["group_size"] = self.group_size
        if self.ndim is not None:
            entry["ndim"] = self.ndim
        return entry


@dataclass
class Recipe:
    name: str
    rules: tuple[Rule, ...]
    _warned: set[tuple[str, str]] = field(default_factory=set, repr=False, compare=False)

    def plan(self, name: str, shape: tuple[int, ...]) -> tuple[str, int | None]:
        """(encoding, group_size) for a tensor; bf16 when the shape cannot take what the rule asks for."""
        shape = tuple(shape)
        rule = next((r for r in self.rules if r.matches(name, shape)), None)
        if rule is None:
            return FALLBACK_ENCODING, None
        group_size = rule.group_size
        if rule.encoding in GROUPED_ENCODINGS and group_size is None and shape:
            group_size = next(
                (g for g in sorted(GROUP_SIZES, reverse=True) if shape[-1] % g == 0), GROUP_SIZES[0]
            )
        problem = encoding_problem(rule.encoding, shape, group_size)
        if problem is None:
            return rule.encoding, group_size
        # Once per rule and kind of problem: a 64-layer model would otherwise repeat it 64 times.
        if (rule.pattern, problem) not in self._warned:
            self._warned.add((rule.pattern, problem))
            log.warning(
                "recipe %s: %s (first seen on %s %s); storing such tensors as %s",
                self.name,
                problem,
                name,
                list(shape),
                FALLBACK_ENCODING,
            )
        return FALLBACK_ENCODING, None

    def to_json(self) -> dict:
        """The manifest's `recipe` section: the resolved rule list, base rules included."""
        return {"name": self.name, "rules": [rule.to_json() for rule in self.rules]}


# Every built-in keeps the vision tower (carried for a later issue) in bf16, and 1-D tensors (norm weights,
# A_log, dt_bias, biases) and the tiny GDN conv in f32: they are a rounding error of the file size and feed
# exponentials, gates and normalisers directly.
_KEEP_PRECISE = (
    Rule("visual.*", "bf16"),
    Rule("*", "f32", ndim=1),
    Rule("*.gdn.conv", "f32"),
)
# The MoE router and the shared-expert gate decide which experts run (a top-k over their outputs): a small
# error flips choices, and they are [E, H] / [1, H], so bf16 costs next to nothing.
_ROUTING_BF16 = (Rule("*.moe.router", "bf16"), Rule("*.shared_expert_gate", "bf16"))
# GDN's in_a / in_b ([Hv, H]) drive the decay and beta gates, which compound over every token of the state.
_GDN_GATES_BF16 = (Rule("*.gdn.in_a", "bf16"), Rule("*.gdn.in_b", "bf16"))

BUILTIN_RECIPES: dict[str, tuple[Rule, ...]] = {
    "bf16": (*_KEEP_PRECISE, Rule("*", "bf16")),
    "fp8": (*_KEEP_PRECISE, Rule("embed", "bf16"), *_ROUTING_BF16, Rule("*", "fp8_e4m3")),
    "groupwise-int": (
        *_KEEP_PRECISE,
        Rule("embed", "int8", 64),
        Rule("lm_head", "int8", 64),
        *_ROUTING_BF16,
        *_GDN_GATES_BF16,
        Rule("*", "int4"),
    ),
    "nvfp4": (
        *_KEEP_PRECISE,
        Rule("embed", "bf16"),
        Rule("lm_head", "fp8_e4m3"),
        *_ROUTING_BF16,
        *_GDN_GATES_BF16,
        Rule("*", "nvfp4"),
    ),
}


def load_recipe(name_or_path: str) -> Recipe:
    """A built-in recipe by name, or a JSON recipe file (see docs/artifacts.md)."""
    if name_or_path in BUILTIN_RECIPES:
        return Recipe(name_or_path, BUILTIN_RECIPES[name_or_path])
    path = Path(name_or_path)
    if not path.is_file():
        raise RecipeError(
            f"unknown recipe {name_or_path!r}: not a built-in ({', '.join(BUILTIN_RECIPES)}) and no such file"
        )
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecipeError(f"recipe {path}: cannot read it as JSON: {exc}") from exc
    return _recipe_from_json(path, spec)


def _recipe_from_json(path: Path, spec: object) -> Recipe:
    where = f"recipe {path}"
    if not isinstance(spec, dict):
        raise RecipeError(f"{where}: expected a JSON object with 'name', 'base' and 'rules'")
    unknown = set(spec) - {"name", "base", "rules"}
    if unknown:
        raise RecipeError(f"{where}: unknown key(s) {sorted(unknown)} (expected 'name', 'base', 'rules')")
    name = spec.get("name", path.stem)
    base = spec.get("base", "bf16")
    if not isinstance(name, str):
        raise RecipeError(f"{where}: 'name' must be a string")
    if base not in BUILTIN_RECIPES:
        raise RecipeError(f"{where}: base {base!r} is not a built-in recipe ({', '.join(BUILTIN_RECIPES)})")
    rules = spec.get("rules", [])
    if not isinstance(rules, list):
        raise RecipeError(f"{where}: 'rules' must be a list")
    parsed = tuple(_rule_from_json(f"{where}: rule {i}", entry) for i, entry in enumerate(rules))
    return Recipe(name, parsed + BUILTIN_RECIPES[base])


def _rule_from_json(where: str, entry: object) -> Rule:
    if not isinstance(entry, dict) or not isinstance(entry.get("pattern"), str):
        raise RecipeError(f"{where}: expected an object with a string 'pattern'")
    where = f"{where} (pattern {entry['pattern']!r})"
    unknown = set(entry) - {"pattern", "encoding", "group_size", "ndim"}
    if unknown:
        raise RecipeError(f"{where}: unknown key(s) {sorted(unknown)}")
    encoding, group_size, ndim = entry.get("encoding"), entry.get("group_size"), entry.get("ndim")
    if encoding not in ENCODINGS:
        raise RecipeError(f"{where}: unknown encoding {encoding!r} (known: {', '.join(ENCODINGS)})")
    if group_size is not None:
        if encoding not in GROUPED_ENCODINGS:
            raise RecipeError(f"{where}: group_size applies only to int8/int4/int4_affine, not {encoding}")
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size not in GROUP_SIZES:
            raise RecipeError(f"{where}: group_size must be 32, 64 or 128, not {group_size!r}")
    if ndim is not None and (not isinstance(ndim, int) or isinstance(ndim, bool) or ndim < 1):
        raise RecipeError(f"{where}: ndim must be a positive integer, not {ndim!r}")
    return Rule(entry["pattern"], encoding, group_size, ndim)
