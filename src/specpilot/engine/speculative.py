"""The decode loop: draft → select → verify (one target forward) → commit / roll back → observe.

One loop serves every method: plain decoding is the same loop with no drafter (each step verifies
zero drafted tokens and emits the target's own token, through the same runner and sampler), and
adaptive methods plug in as drafters and policies without touching this file.

Invariant: after every step the target cache holds exactly len(sequence) − 1 positions, and the
runner's record of the slot (models.synced_cache) lists them; the last committed token is fed at
the start of the next step together with the drafted tokens.

Prefix reuse: a request keeps whatever its cache slot holds of its prompt and prefills only the
rest: the next turn of a conversation feeds only the new turn (and the end of the last answer),
and prompts sharing a system prompt share its keys/values. Drafters reuse their caches the same
way. `clear_cache` starts from nothing, for cold-start timing.

Requests join and leave the batch between steps (engine.scheduler, continuous batching); this
module holds the steps the scheduler runs: prefill newly admitted rows, and one decode step over
every running row.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch

from specpilot.config import GenerationConfig, SamplingConfig
from specpilot.drafting.base import Drafter, LearningDrafter
from specpilot.engine.request import GenerationResult, Request, check_prompt
from specpilot.engine.scheduler import Scheduler
from specpilot.engine.stopping import StopChecker
from specpilot.engine.target_pass import TargetPass, default_target_pass
from specpilot.errors import ConfigError
from specpilot.models.chat import Messages, encode_prompt
from specpilot.models.runner import CausalRunner
from specpilot.models.synced_cache import sync
from specpilot.policies.base import (
    BatchPlanner,
    CacheHolder,
    DraftPolicy,
    TimedPolicy,
    VerifyPolicy,
)
from specpilot.policies.draft import ConstantPolicy
from specpilot.policies.verify_all import VerifyAll
from specpilot.sampling import top_probability
from specpilot.types import Proposal, StepRecord
from specpilot.verify.rules import verify
from specpilot.verify.tree import verify_tree


class SpeculativeEngine:
    """Lossless speculative decoding of one target with a pluggable drafter and policies.

    With `drafter=None` it is plain autoregressive decoding (the baseline).

    `observers`: callables run once per verified row-step as
    `observer(slot, proposal, target_logits, record)`, with the proposal as verified, the target's
    verify logits for it ([k + 1, vocab]) and the step's StepRecord. They watch without changing
    the decoding (profiling, logging), so tools need not wrap the target or the policies.

    `planner`: an optional BatchPlanner that turns the rows' budgets into each step's final
    budgets from the whole batch (the goodput controller); it observes each step's timings.

    `method`: what built it, as a method string with its drafter and policy resolved
    (methods.MethodSpec), for reports ("" when built by hand).

    `target_pass`: the target's forwards (default: the drafter's, engine.target_pass); one that
    also keeps what the forwards computed (training.eagle.answer_features) records the target's
    features of its own answers."""

    def __init__(
        self,
        target: CausalRunner,
        tokenizer,
        drafter: Drafter | None = None,
        draft_policy: DraftPolicy | None = None,
        verify_policy: VerifyPolicy | None = None,
        eos_ids: frozenset[int] | set[int] | None = None,
        planner: BatchPlanner | None = None,
        method: str = "",
        target_pass: TargetPass | None = None,
    ):
        self.target = target
        self.method = method
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.draft_policy = draft_policy or ConstantPolicy()
        self.verify_policy = verify_policy or VerifyAll()
        self.planner = planner
        if eos_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            eos_ids = set() if eos is None else {eos}
        self.eos_ids = frozenset(eos_ids)
        self.observers: list[Callable[[int, Proposal, torch.Tensor, StepRecord], None]] = []
        self.target_pass = target_pass or default_target_pass(target, drafter)
        """The target's forwards, with a feature drafter's hand-off (engine.target_pass)."""
        self.learner = drafter if isinstance(drafter, LearningDrafter) else None
        """The drafter, if it learns from each verified chain (DVI)."""

    def generate(
        self,
        prompt: str | Messages | list[int],
        config: GenerationConfig | None = None,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> GenerationResult:
        """Continue a prompt: text or chat messages (formatted with the chat template) or token ids.

        `on_tokens` receives each step's new tokens, for streaming."""
        stream = None if on_tokens is None else (lambda _row, tokens: on_tokens(tokens))
        return self.generate_batch([prompt], config, stream)[0]

    def generate_batch(
        self,
        prompts: list[str | Messages | list[int]],
        config: GenerationConfig | list[GenerationConfig] | None = None,
        on_tokens: Callable[[int, list[int]], None] | None = None,
    ) -> list[GenerationResult]:
        """Decode several prompts together: one draft forward per drafted position and one target
        forward per step serve the whole batch (the weights are read once for all rows).

        `config` is one for every row or a list of one per row (e.g. each its own seed). Each
        row accepts its own number of tokens, finishes on its own, and uses its own random
        generator seeded with its config's `seed` and its own copy of the draft policy. So
        greedy rows equal plain greedy decoding (exactly in float32; bf16 packs change
        rounding), and sampled rows give the tokens they give alone, unless a rule couples rows:
        SV's batch allocation or a DVI head learning on the batch; then only the target's
        distribution is preserved (docs/methods.md §1.3). `on_tokens(row, tokens)` streams."""
        if not 1 <= len(prompts) <= self.target.batch_size:
            raise ConfigError(
                f"a batch of {len(prompts)} prompts needs 1..{self.target.batch_size} prompts; "
                "load the models with a larger batch_size"
            )
        configs = config if isinstance(config, list) else [config] * len(prompts)
        if len(configs) != len(prompts):
            raise ConfigError(
                f"{len(configs)} generation configs for {len(prompts)} prompts: pass one config "
                "for every row or one per row"
            )
        scheduler = Scheduler(self, finish_together=True)
        requests = [
            scheduler.submit(
                prompt, row_config, None if on_tokens is None else functools.partial(on_tokens, i)
            )
            for i, (prompt, row_config) in enumerate(zip(prompts, configs, strict=True))
        ]
        scheduler.run()
        return [request.result for request in requests]

    # -- the surface the scheduler drives (engine.scheduler) ---------------------------------
    def encode(self, prompt: str | Messages | list[int]) -> list[int]:
        """A prompt's token ids: text and messages through the chat template, ids as they are.
        Raises PromptError for an empty or too long prompt."""
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and prompt:
            prompt_ids = list(prompt)
        else:
            prompt_ids = encode_prompt(self.tokenizer, prompt)
        check_prompt(prompt_ids, self.target.max_length)
        return prompt_ids

    def stop_rule(self, config: GenerationConfig) -> StopChecker:
        """A request's stopping rule (its stop strings and ids, and the end-of-sequence ids)."""
        return StopChecker.for_request(config, self.eos_ids, self.tokenizer)

    def reset(self) -> None:
        """Forget per-request state in the drafter and verify policy before a batch starts
        (each request resets its own draft-policy copy)."""
        for plug in (self.drafter, self.verify_policy):
            if plug is not None:
                plug.reset()

    def reusable(self, slot: int, request: Request) -> int:
        """Leading prompt tokens `slot` holds for `request` (what its prefill can skip)."""
        return self.target_pass.reusable(slot, request.prompt_ids)

    def prefill(self, rows: list[Request], budget: int | None = None) -> None:
        """Feed the rows' prompts (less what their slots hold; at most `budget` tokens in all,
        the earliest rows first) in one target forward, and their features to a drafter that
        reads them; a row whose prompt is then in the cache is marked `prefilled`."""
        start = time.perf_counter()
        for row in rows:
            self.target_pass.trim(row.slot, row.prompt_ids)
        feeds = [sync(self.target, row.prompt_ids, row.slot)[:-1] for row in rows]
        pieces, left = [], budget
        for feed in feeds:
            pieces.append(feed if left is None else feed[:left])
            left = None if left is None else left - len(pieces[-1])
        # (row, its piece, the position the piece starts at); a row whose prompt the slot holds
        # whole has an empty feed and is fed nothing.
        fed = [
            (row, piece, len(row.prompt_ids) - 1 - len(feed))
            for row, piece, feed in zip(rows, pieces, feeds, strict=True)
            if piece or not feed
        ]
        self.target_pass.forward(
            [piece for _, piece, _ in fed], [row.slot for row, _, _ in fed], "none"
        )
        for index, (row, piece, start_position) in enumerate(fed):
            self.target.cached.add(row.slot, piece)
            self.target_pass.commit(index, row.slot, start_position, piece, None)
            row.prefilled = start_position + len(piece) == len(row.prompt_ids) - 1
        prefill_s = time.perf_counter() - start
        for row, piece, _ in fed:
            row.stats.prefill_s += prefill_s
            row.stats.prefill_tokens += len(piece)

    def step(self, rows: list[Request], finish_together: bool = False) -> None:
        """Draft → select → verify all rows in one target forward → commit each row.
        `finish_together`: the caller waits for the last of these rows (planners are told each
        row's remaining tokens)."""
        samplings = [row.config.sampling for row in rows]
        step_start = time.perf_counter()
        budgets = [
            min(row.policy.draft_budget(), row.room(self.target.max_length) - 1) for row in rows
        ]
        if self.planner is not None:
            remaining = [row.room(self.target.max_length) for row in rows]
            budgets = self.planner.plan(
                [row.policy for row in rows], budgets, remaining if finish_together else None
            )
        draft_start = time.perf_counter()
        proposals = [Proposal([]) for _ in rows]
        if self.drafter is not None and any(budget > 0 for budget in budgets):
            proposals = self._propose(rows, budgets, samplings)
        drafted = [proposal.depth for proposal in proposals]
        counts = self.verify_policy.select(
            [row.sequence for row in rows], proposals, [row.slot for row in rows], samplings
        )
        proposals = [
            # A tree may hold more nodes than the context has room for (its chain never does).
            p.truncated(min(n, self.target.max_length - len(row.sequence)))
            for p, n, row in zip(proposals, counts, rows, strict=True)
        ]
        trees = [p.parents for p in proposals]
        verify_start = time.perf_counter()
        logits = self.target_pass.forward(
            [[row.sequence[-1], *p.tokens] for row, p in zip(rows, proposals, strict=True)],
            [row.slot for row in rows],
            "all",
            trees,
        )  # per row [k + 1, vocab]
        results = [
            verify(p.tokens, p.draft_probs, row_logits, row.config.sampling, row.generator)
            if p.parents is None
            else verify_tree(
                p.tokens,
                p.parents,
                p.draft_probs,
                row_logits,
                row.config.sampling,
                row.generator,
            )
            for row, p, row_logits in zip(rows, proposals, logits, strict=True)
        ]
        verify_s = time.perf_counter() - verify_start
        confident = self.planner is not None and self.planner.reads_target_confidence
        records = []
        for index, (row, proposal, result, num_drafted, row_logits) in enumerate(
            zip(rows, proposals, results, drafted, logits, strict=True)
        ):
            if self.learner is not None:  # an online learner learns from the chain
                chain = proposal.truncated(proposal.chain_length)
                self.learner.observe(row.slot, chain, row_logits, result.chain_accepted)
            if result.path is not None:
                self.target.keep_path(row.slot, len(row.sequence) - 1, result.path)
            held = len(row.sequence) - 1
            emitted = row.commit(result.emitted(proposal.tokens))
            self.target.rollback(len(row.sequence) - 1, slot=row.slot)
            committed = row.sequence[held:-1]  # the root and the accepted tokens
            self.target.cached.add(row.slot, committed)
            self.target_pass.commit(index, row.slot, held, committed, result.path)
            record = StepRecord(
                num_drafted=num_drafted,
                num_verified=proposal.depth,
                num_accepted=result.num_accepted,
                num_emitted=len(emitted),
                draft_s=proposal.draft_s,
                verify_s=verify_s,
                context_len=len(row.sequence),
                num_nodes=proposal.k,
                policy_s=self._policy_seconds(row.policy),
                target_confidence=top_probability(row_logits[0]) if confident else None,
            )
            records.append(record)
            row.stats.add(record)
            row.policy.observe(record)
            self.verify_policy.observe(record)
            for observer in self.observers:
                observer(row.slot, proposal, row_logits, record)
            if row.on_tokens is not None and emitted:
                row.on_tokens(emitted)
            if row.reason is None and len(row.sequence) >= self.target.max_length:
                row.reason = "length"
        if self.planner is not None:  # drafting includes selection (SV's companion)
            draft_s = verify_start - draft_start
            step_s = time.perf_counter() - step_start
            self.planner.observe(budgets, records, draft_s, verify_s, step_s)

    def clear_cache(self) -> None:
        """Forget every cached prefix (target, drafter and verify-policy models), so the next
        request prefills its whole prompt: for cold-start measurements."""
        self.target.reset()
        for plug in (self.drafter, self.verify_policy):
            if isinstance(plug, CacheHolder):  # a plug with a model of its own
                plug.clear_cache()

    def _propose(
        self, rows: list[Request], budgets: list[int], samplings: list[SamplingConfig]
    ) -> list[Proposal]:
        """Every row drafts in its own cache slot, however few rows are still running."""
        return self.drafter.propose(
            [row.sequence for row in rows],
            [row.slot for row in rows],
            budgets,
            [row.policy for row in rows],
            samplings,
            [row.generator for row in rows],
        )

    @staticmethod
    def _policy_seconds(policy: DraftPolicy) -> float:
        """A policy's own deciding time this step (LTD's networks), else 0."""
        return policy.take_seconds() if isinstance(policy, TimedPolicy) else 0.0
