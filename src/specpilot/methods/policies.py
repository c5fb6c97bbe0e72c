"""The policy table: every policy by name, its declared options and its builder.

A builder gets the loaded models, `drafts` (which builds the method's drafter, shaped by the
policy passed to it where the policy sizes trees: LTD, tree-goodput) and its converted options;
it returns the method's parts. So the draft-length policies, SV (constant drafting + SV's
verified prefix) and the goodput controller all register the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specpilot.errors import ConfigError
from specpilot.methods.defaults import DEFAULT_K, SV_GAMMA_MAX
from specpilot.methods.goodput import make_goodput
from specpilot.methods.options import Option, convert_all, fields_of, keywords_of
from specpilot.methods.sv import sv_verify_policy
from specpilot.models.pair import ModelPair
from specpilot.policies import (
    ConstantPolicy,
    DraftPolicy,
    HeuristicPolicy,
    SvipPolicy,
    VerifyPolicy,
)
from specpilot.policies.sv import read_sv_profile
from specpilot.policies.tree_goodput import TreeGoodputPolicy

Drafts = Callable[..., Any]
"""drafts(shaper=None) → the drafter; a shaper's `drafter_options` sets the tree it needs."""


@dataclass(frozen=True)
class Parts:
    """What a method decodes with, beside the target."""

    drafter: Any
    draft_policy: DraftPolicy
    verify_policy: VerifyPolicy | None = None
    planner: Any = None
    """The goodput controller, which plans every row's draft length each step."""


@dataclass(frozen=True)
class PolicyEntry:
    name: str
    options: tuple[Option, ...]
    build: Callable[..., Parts]
    """build(models, drafts, **options) → Parts."""
    check: Callable[..., None] | None = None
    """check(**options): what can be validated before any model is loaded."""
    verifies: bool = False
    """Whether it brings its own verify policy (a ready one cannot be added)."""


def make_policy(name: str, models: ModelPair | None = None, drafts: Drafts = None, **options):
    """The parts of policy `name` (options given as values or strings); `drafts` defaults to no
    drafter, for policies that need none to be built."""
    entry = policy_entry(name)
    converted = convert_all(entry.options, options, f"policy {name!r}")
    return entry.build(models, drafts or (lambda shaper=None: None), **converted)


def policy_entry(name: str) -> PolicyEntry:
    if name not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return POLICIES[name]


def constant(models: ModelPair, drafts: Drafts, k: int | None = None) -> Parts:
    """Draft k tokens every step (default: the drafter's natural depth, a tree's, else
    DEFAULT_K)."""
    drafter = drafts()  # None: plain decoding
    if k is None:
        k = (drafter.default_budget if drafter is not None else None) or DEFAULT_K
    return Parts(drafter, ConstantPolicy(k))


def _plain(cls: type) -> Callable[..., Parts]:
    """A draft-length policy built from its own fields."""
    return lambda models, drafts, **options: Parts(drafts(), cls(**options))


def _shaping(cls: type) -> Callable[..., Parts]:
    """A tree policy built from its own fields, which sets the tree the drafter grows."""

    def build(models: ModelPair, drafts: Drafts, **options: Any) -> Parts:
        policy = cls(**options)
        return Parts(drafts(policy), policy)

    return build


def ltd(
    models: ModelPair,
    drafts: Drafts,
    ltd_policies: str | None = None,
    use: str = "both",
    check_every: int = 1,
) -> Parts:
    """LTD's learned tree policies from `ltd_policies` (a `train-ltd --out` folder or its
    policies/ folder; default: the ones committed for the target and its backend); `use` both,
    depth or size; the depth policy consulted every `check_every` levels."""
    from specpilot.policies.ltd import LtdPolicy
    from specpilot.policies.ltd_net import LtdNets, resolve_policies

    backend = models.target.runner.backend
    nets = LtdNets.load(resolve_policies(ltd_policies, models.target.name, backend))
    policy = LtdPolicy(nets, use, check_every)
    return Parts(drafts(policy), policy)


def sv(
    models: ModelPair,
    drafts: Drafts,
    sv_profile: str | None = None,
    companion: str | None = None,
    gamma_max: int = SV_GAMMA_MAX,
    plus_one: bool = True,
) -> Parts:
    """SV: draft `gamma_max` tokens, verify the goodput-optimal prefix (policies.sv)."""
    verify_policy = sv_verify_policy(models, sv_profile, companion, plus_one)
    return Parts(drafts(), ConstantPolicy(gamma_max), verify_policy)


def goodput(models: ModelPair, drafts: Drafts, **options: Any) -> Parts:
    """The goodput controller plans every row's draft length (methods.goodput.make_goodput)."""
    drafter = drafts()
    row, controller, verify_policy = make_goodput(models, drafter, **options)
    return Parts(drafter, row, verify_policy, controller)


def _check_constant(k: int | None = None) -> None:
    if k is not None:
        ConstantPolicy(k)


def _check_sv(sv_profile: str | None = None, **_: Any) -> None:
    read_sv_profile(sv_profile)


def _check_sv_trim(sv_profile: str | None = None, companion: str | None = None, **_: Any) -> None:
    if sv_profile is not None or companion is not None:  # SV trims what the controller drafted
        read_sv_profile(sv_profile)


POLICIES: dict[str, PolicyEntry] = {
    entry.name: entry
    for entry in (
        PolicyEntry("constant", keywords_of(constant, 2), constant, check=_check_constant),
        PolicyEntry(
            "heuristic", fields_of(HeuristicPolicy), _plain(HeuristicPolicy), HeuristicPolicy
        ),
        PolicyEntry("svip", fields_of(SvipPolicy), _plain(SvipPolicy), SvipPolicy),
        PolicyEntry("ltd", keywords_of(ltd, 2), ltd),
        PolicyEntry(
            "tree-goodput",
            fields_of(TreeGoodputPolicy),
            _shaping(TreeGoodputPolicy),
            TreeGoodputPolicy,  # its fields are checked when made
        ),
        PolicyEntry("sv", keywords_of(sv, 2), sv, check=_check_sv, verifies=True),
        PolicyEntry(
            "goodput",
            keywords_of(make_goodput, 2),
            goodput,
            check=_check_sv_trim,
            verifies=True,
        ),
    )
}
"""Every policy: the draft-length policies, SV and the goodput controller."""
