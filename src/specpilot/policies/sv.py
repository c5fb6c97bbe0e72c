"""SV (Speculative Verification; docs/methods.md §4): a companion model predicts which drafted
tokens the target will accept, and the target verifies only the goodput-optimal prefix.

Per step: one teacher-forced companion forward over the drafted tokens gives, for each drafted
token, S = Σ_v min(P_draft, P_comp) and A = min(1, P_comp(t)/P_draft(t)); the offline table
(`specpilot profile-sv`) maps (S, A) to an acceptance probability p_i; the verify length
maximises (E[accepted] + 1) / T_verify for one request, or the greedy cross-request allocation
for a batch. Verifying a prefix of a proposal is lossless (docs/methods.md §1.2), whatever p says.

Indicators use the distributions tokens are actually drawn from: the warped sampling
distributions, or under greedy decoding the temperature-1 softmax (the one-hot argmax would make
S and A carry no more than "the companion agrees").

Losslessness under sampling (a correction to the paper's rule): whether drafted token t_i is
verified must not depend on t_i itself. If it did (the paper looks up p_i from A_i, which is a
function of t_i), tokens would be verified mostly when they are likely to be accepted, and the
output would lean towards the draft (tests/lossless/test_sv.py shows the chi-square failure).
So the decision to add position i uses the forecast p̄_i = E_{t~q_i}[p(S_i, A_i(t))] (over the
draft's FORECAST_TOP most likely tokens), which depends only on the prefix; positions already
added count with their realised p. Under greedy decoding drafting is deterministic and
p̄_i = p_i: the paper's rule exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specpilot.config import SamplingConfig
from specpilot.errors import ConfigError
from specpilot.models.runner import CausalRunner
from specpilot.models.synced_cache import sync
from specpilot.policies.latency import VerifyLatency
from specpilot.policies.sv_length import allocate_batch, choose_length
from specpilot.policies.sv_table import AcceptanceTable
from specpilot.sampling import logits_to_probs
from specpilot.types import Proposal, StepRecord


def indicator_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """[k, vocab] distributions the indicators compare (see the module docstring)."""
    if sampling.greedy:
        return logits.float().softmax(-1)
    return logits_to_probs(logits, sampling)


def indicators(
    draft_probs: torch.Tensor, companion_probs: torch.Tensor, tokens: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """S and A per drafted token ([k] each)."""
    if draft_probs.shape != companion_probs.shape:
        raise ConfigError(
            f"SV compares draft and companion distributions over one vocabulary, got "
            f"{tuple(draft_probs.shape)} and {tuple(companion_probs.shape)} (a reduced draft "
            "vocabulary cannot be used with SV)"
        )
    similarity = torch.minimum(draft_probs, companion_probs).sum(-1)
    index = torch.tensor(tokens, dtype=torch.long, device=draft_probs.device).unsqueeze(-1)
    return similarity, acceptance_ratio(companion_probs, draft_probs, index)[:, 0]


def acceptance_ratio(probs: torch.Tensor, draft_probs: torch.Tensor, index: torch.Tensor):
    """min(1, p(t) / q(t)) for the token ids in `index` ([k, m]): the chance that a verifier
    with distribution p accepts t drawn from q."""
    ratio = probs.gather(-1, index) / draft_probs.gather(-1, index).clamp_min(1e-30)
    return ratio.clamp(max=1.0)


FORECAST_TOP = 64
"""Draft tokens averaged over for the forecast p̄ (any prefix-only rule is lossless; the top
tokens carry nearly all of q's mass at the temperatures people sample at)."""


class Companion:
    """A companion model scoring drafted tokens, teacher-forced, one forward per step for the
    whole batch; its cache follows the committed sequence like a draft model's."""

    def __init__(self, runner: CausalRunner):
        self.runner = runner

    def score(
        self, sequences: list[list[int]], proposals: list[Proposal], slots: list[int]
    ) -> list[torch.Tensor | None]:
        """Per row, [k, vocab] companion logits at the drafted positions (None when k = 0)."""
        feeds = []
        for sequence, proposal, slot in zip(sequences, proposals, slots, strict=True):
            feed = sync(self.runner, sequence, slot) + proposal.tokens[:-1] if proposal.k else []
            feeds.append(feed)
        outputs = self.runner.forward_batch(feeds, slots, "all")
        scored = []
        for feed, proposal, slot, logits in zip(feeds, proposals, slots, outputs, strict=True):
            self.runner.cached.add(slot, feed)
            scored.append(None if logits is None else logits[-proposal.k :])
        return scored


class SvVerifyPolicy:
    """Verify the goodput-optimal prefix of each drafted chain (pair with a constant γ_max)."""

    def __init__(
        self,
        companion: CausalRunner,
        table: AcceptanceTable,
        latency: VerifyLatency,
        plus_one: bool = True,
    ):
        self.companion = Companion(companion)
        self.table = table
        self.latency = latency
        self.plus_one = plus_one

    @classmethod
    def from_profile(cls, path: str | Path, companion: CausalRunner, **options) -> SvVerifyPolicy:
        profile = read_sv_profile(path)
        return cls(
            companion,
            AcceptanceTable.from_dict(profile["table"]),
            VerifyLatency.from_profile(profile),
            **options,
        )

    def reset(self) -> None:
        pass

    def clear_cache(self) -> None:
        self.companion.runner.reset()

    def acceptance(
        self,
        sequences: list[list[int]],
        proposals: list[Proposal],
        slots: list[int],
        samplings: list[SamplingConfig],
    ) -> tuple[list[list[float]], list[list[float]]]:
        """Per row and drafted token: the forecast p̄_i and the realised p_i (module docstring)."""
        if any(p.k and p.draft_logits is None for p in proposals):
            raise ConfigError(
                "SV needs a draft model's distributions (drafter 'model')", ("drafter",)
            )
        if any(p.parents is not None for p in proposals):
            raise ConfigError("SV sizes chains, not draft trees: use branches=1", ("branches",))
        companion_logits = self.companion.score(sequences, proposals, slots)
        forecasts, realized = [], []
        for proposal, logits, sampling in zip(proposals, companion_logits, samplings, strict=True):
            if logits is None:
                forecasts.append([])
                realized.append([])
                continue
            draft_probs = indicator_probs(proposal.draft_logits, sampling)
            companion_probs = indicator_probs(logits, sampling)
            similarity, acceptance = indicators(draft_probs, companion_probs, proposal.tokens)
            p = [float(x) for x in self.table.lookup(similarity, acceptance)]
            realized.append(p)
            if sampling.greedy:
                forecasts.append(p)
            else:
                forecasts.append(self._forecast(draft_probs, companion_probs, similarity))
        return forecasts, realized

    def _forecast(self, draft_probs, companion_probs, similarity) -> list[float]:
        """p̄_i = Σ_t q_i(t) p(S_i, A_i(t)) / Σ_t q_i(t) over the draft's top tokens."""
        weights, top = draft_probs.topk(min(FORECAST_TOP, draft_probs.shape[-1]), dim=-1)
        acceptance = acceptance_ratio(companion_probs, draft_probs, top)
        s = similarity[:, None].expand_as(acceptance)
        p = torch.from_numpy(self.table.lookup(s.reshape(-1), acceptance.reshape(-1)))
        p = p.reshape(acceptance.shape).to(weights.device, weights.dtype)
        return ((weights * p).sum(-1) / weights.sum(-1).clamp_min(1e-30)).tolist()

    def select(self, sequences, proposals: list[Proposal], slots, samplings) -> list[int]:
        if not any(proposal.k for proposal in proposals):  # nothing drafted: no companion pass
            return [0] * len(proposals)
        forecasts, realized = self.acceptance(sequences, proposals, slots, samplings)
        if len(forecasts) == 1:
            return [choose_length(forecasts[0], self.latency, self.plus_one, realized[0])]
        return allocate_batch(forecasts, self.latency, realized, self.plus_one)

    def observe(self, record: StepRecord) -> None:
        pass


def read_sv_profile(path: str | Path | None) -> dict:
    """An SV profile JSON, with a clear error when it is missing or not one."""
    how = "make one with `specpilot profile-sv --out PATH`"
    if not path:
        raise ConfigError(f"SV needs an acceptance profile (sv_profile); {how}", ("sv_profile",))
    try:
        profile = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"SV profile {str(path)!r} does not exist; {how}") from None
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read SV profile {str(path)!r} ({error}); {how}") from None
    missing = [key for key in ("table", "verify_ms") if key not in profile]
    if missing:
        raise ConfigError(f"{str(path)!r} is not an SV profile (no {', '.join(missing)}); {how}")
    return profile
