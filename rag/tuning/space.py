"""The search space as data: families of techniques (one gene each), their options, and feasibility rules.

A genome is a tuple of option indices, one per family, in the order the families are declared. The first
option of a family is its default ("none" where the technique is optional), which is also what repair falls
back to. Rules say which combinations cannot run, e.g. query expansion without an LLM, or reranking with fewer
than 2·k candidates; they are checked against the capabilities of the run ("llm", "generator",
"trained-reranker") and against the settings a genome decodes to.
"""

from __future__ import annotations

import ast
import itertools
import operator
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

Genome = tuple[int, ...]

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SPACE_PATH = REPO_ROOT / "config" / "search_space.yaml"


class Option(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict, description="settings this option sets")


class Family(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    options: list[Option] = Field(min_length=1)

    def index_of(self, option: str) -> int:
        for i, o in enumerate(self.options):
            if o.name == option:
                return i
        raise ValueError(
            f"family {self.name!r} has no option {option!r} (options: {', '.join(o.name for o in self.options)})"
        )


class Rule(BaseModel):
    """`when` the genome picks one of these options, it `requires` capabilities, must not pick a `forbid`
    option, and its decoded settings must satisfy `check` (e.g. "candidates >= 2 * k")."""

    model_config = ConfigDict(extra="forbid")
    name: str
    when: dict[str, list[str]]
    requires: list[str] = Field(default_factory=list)
    forbid: dict[str, list[str]] = Field(default_factory=dict)
    check: str | None = None
    reason: str = ""


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.GtE: operator.ge,
    ast.Gt: operator.gt,
    ast.LtE: operator.le,
    ast.Lt: operator.lt,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


def evaluate_check(expression: str, settings: dict[str, Any]) -> bool:
    """A comparison over settings names, numbers and + - * / (no calls, no attributes: rules are data)."""

    def value(node: ast.AST):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in settings or settings[node.id] is None:
                raise ValueError(
                    f"rule check {expression!r} names {node.id!r}, which no option or base setting defines"
                )
            return settings[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"rule check {expression!r}: only names, numbers, + - * / and comparisons are allowed")

    tree = ast.parse(expression, mode="eval").body
    if not isinstance(tree, ast.Compare) or len(tree.ops) != 1 or type(tree.ops[0]) not in _OPS:
        raise ValueError(f"rule check {expression!r} must be one comparison, e.g. 'candidates >= 2 * k'")
    return bool(_OPS[type(tree.ops[0])](value(tree.left), value(tree.comparators[0])))


class SearchSpace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    families: list[Family] = Field(min_length=1)
    rules: list[Rule] = Field(default_factory=list)
    base: dict[str, Any] = Field(default_factory=dict, description="settings every candidate shares")
    baseline: dict[str, str] = Field(
        default_factory=dict,
        description="the naive configuration: option per family (families not named take their default)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SearchSpace:
        names = [f.name for f in self.families]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate family names in {names}")
        for f in self.families:
            opts = [o.name for o in f.options]
            if len(set(opts)) != len(opts):
                raise ValueError(f"family {f.name!r} has duplicate option names {opts}")
        for rule in self.rules:
            for fam, options in (rule.when | rule.forbid).items():
                family = self.family(fam)
                for option in options:
                    family.index_of(option)
        for fam, option in self.baseline.items():
            self.family(fam).index_of(option)
        return self

    # --- lookup ---------------------------------------------------------------------------------
    def family(self, name: str) -> Family:
        for f in self.families:
            if f.name == name:
                return f
        raise ValueError(f"unknown family {name!r} (families: {', '.join(f.name for f in self.families)})")

    def position(self, family: str) -> int:
        return [f.name for f in self.families].index(self.family(family).name)

    @property
    def sizes(self) -> list[int]:
        return [len(f.options) for f in self.families]

    @property
    def size(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    # --- encoding -------------------------------------------------------------------------------
    def decode(self, genome: Genome) -> dict[str, str]:
        self._check_shape(genome)
        return {f.name: f.options[i].name for f, i in zip(self.families, genome)}

    def encode(self, choices: dict[str, str]) -> Genome:
        """Option names per family → genome; families not named take their default."""
        unknown = set(choices) - {f.name for f in self.families}
        if unknown:
            raise ValueError(f"unknown families {sorted(unknown)}")
        return tuple(f.index_of(choices[f.name]) if f.name in choices else 0 for f in self.families)

    def settings(self, genome: Genome) -> dict[str, Any]:
        """The configuration a genome stands for: base settings overlaid with every chosen option's params."""
        self._check_shape(genome)
        out = dict(self.base)
        for f, i in zip(self.families, genome):
            out.update(f.options[i].params)
        return out

    def key(self, genome: Genome) -> str:
        return "|".join(f"{k}={v}" for k, v in self.decode(genome).items())

    def default(self) -> Genome:
        return tuple(0 for _ in self.families)

    def baseline_genome(self) -> Genome:
        return self.encode(self.baseline)

    def _check_shape(self, genome: Genome) -> None:
        if len(genome) != len(self.families) or any(not 0 <= g < s for g, s in zip(genome, self.sizes)):
            raise ValueError(f"genome {genome} does not fit the space (option counts {self.sizes})")

    # --- feasibility ----------------------------------------------------------------------------
    def violations(
        self, genome: Genome, capabilities: set[str] | frozenset[str] = frozenset()
    ) -> list[tuple[Rule, str]]:
        """(rule, why) for every rule the genome breaks."""
        choice = self.decode(genome)
        settings = None
        out: list[tuple[Rule, str]] = []
        for rule in self.rules:
            if not any(choice[fam] in options for fam, options in rule.when.items()):
                continue
            missing = [c for c in rule.requires if c not in capabilities]
            if missing:
                out.append((rule, f"needs {', '.join(missing)}"))
                continue
            clash = [f"{fam}={choice[fam]}" for fam, options in rule.forbid.items() if choice[fam] in options]
            if clash:
                out.append((rule, f"not with {', '.join(clash)}"))
                continue
            if rule.check:
                settings = settings if settings is not None else self.settings(genome)
                if not evaluate_check(rule.check, settings):
                    out.append((rule, f"fails {rule.check}"))
        return out

    def feasible(self, genome: Genome, capabilities: set[str] | frozenset[str] = frozenset()) -> bool:
        return not self.violations(genome, capabilities)

    def repair(self, genome: Genome, capabilities: set[str] | frozenset[str] = frozenset()) -> Genome:
        """Reset the triggering family of each broken rule to its default until the genome is feasible."""
        genome = tuple(genome)
        for _ in range(len(self.families) + 1):
            broken = self.violations(genome, capabilities)
            if not broken:
                return genome
            rule, _why = broken[0]
            changed = list(genome)
            for fam in rule.when:
                changed[self.position(fam)] = 0
            if tuple(changed) == genome:
                break
            genome = tuple(changed)
        raise ValueError(
            f"cannot repair {self.key(genome)}: the defaults themselves break "
            f"{[r.name for r, _ in self.violations(genome, capabilities)]}; fix the space's rules"
        )

    def feasible_genomes(self, capabilities: set[str] | frozenset[str] = frozenset()) -> Iterator[Genome]:
        """Every feasible genome, in lexicographic order of option indices (the grid)."""
        for genome in itertools.product(*(range(s) for s in self.sizes)):
            if self.feasible(genome, capabilities):
                yield genome

    def random_genome(self, rng: random.Random, capabilities: set[str] | frozenset[str] = frozenset()) -> Genome:
        return self.repair(tuple(rng.randrange(s) for s in self.sizes), capabilities)

    def restrict(self, family: str, options: list[str]) -> SearchSpace:
        """The same space with one family cut down to `options` (kept in the given order)."""
        fam = self.family(family)
        kept = [fam.options[fam.index_of(o)] for o in options]
        families = [f.model_copy(update={"options": kept}) if f.name == family else f for f in self.families]
        keep = lambda table: {k: [o for o in v if k != family or o in options] for k, v in table.items()}  # noqa: E731
        rules = [r.model_copy(update={"when": keep(r.when), "forbid": keep(r.forbid)}) for r in self.rules]
        rules = [r for r in rules if any(r.when.values())]  # a rule only about removed options never fires
        baseline = dict(self.baseline)
        if baseline.get(family) not in options:
            baseline.pop(family, None)
        return SearchSpace(families=families, rules=rules, base=self.base, baseline=baseline)


def load_space(path: str | Path | None = None) -> SearchSpace:
    path = Path(path or DEFAULT_SPACE_PATH)
    if not path.exists():
        raise FileNotFoundError(f"search space {path} does not exist: copy config/search_space.yaml and edit it")
    raw = yaml.safe_load(path.read_text()) or {}
    families = [
        {"name": name, **(body if isinstance(body, dict) else {"options": body})}
        for name, body in (raw.get("families") or {}).items()
    ]
    for fam in families:
        param = fam.pop("param", None)
        fam["options"] = [_option(o, param) for o in fam.get("options") or []]
    try:
        return SearchSpace(
            families=families,
            rules=raw.get("rules") or [],
            base=raw.get("base") or {},
            baseline=raw.get("baseline") or {},
        )
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _option(entry, param: str | None = None) -> dict:
    """YAML shorthand: `- paragraph` (sets the family's `param` to the name, if it has one) or
    `- {name: hybrid-cc-0.3, mode: hybrid-cc, alpha: 0.3}` (the other keys are the settings it sets)."""
    if isinstance(entry, str):
        return {"name": entry, "params": {param: entry} if param else {}}
    entry = dict(entry)
    name = entry.pop("name", None)
    if name is None:
        raise ValueError(f"option {entry} has no name")
    return {"name": str(name), "params": entry.pop("params", None) or entry}
