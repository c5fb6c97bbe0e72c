"""Gymnasium environments over replay logs: one for the size policy, one for the depth policy.

An episode is one draft–verify cycle at a recorded position. The size environment shows the
whole tree (grown to a random depth U[1, max_depth] as in the LTD paper, or as far as a frozen
depth policy lets it) and is rewarded for its choice of V at once. The depth environment walks
the levels: CONTINUE (1) grows one more level for reward 0; STOP (0), or reaching the maximum
depth, verifies V candidates (a fixed V or a frozen size policy's choice) and pays the reward.
Its positions follow the decoding trajectory: the next episode starts where the cycle's
accepted tokens and the bonus token leave the sequence (the authors' "the next reset continues
the same generation"), and a new prompt starts when one is used up.

Rewards (`REWARDS`, the paper's Table 2 ablation): "throughput" (accepted + 1) / time in 10 ms
units as in the authors' code, "accepted" (accepted + 1), "time" (− time in 10 ms units).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from specpilot.bench.hindsight import hindsight_rate
from specpilot.config import require
from specpilot.policies.ltd import argmax, depth_observation, size_observation
from specpilot.training.ltd.config import REWARDS
from specpilot.training.ltd.cost import CostModel
from specpilot.training.ltd.replay import ReplayLog

CONTINUE = 1


def reward(kind: str, accepted: int, ms: float) -> float:
    if kind == "throughput":
        return (accepted + 1) / (ms / 10)
    if kind == "accepted":
        return float(accepted + 1)
    return -ms / 10


@dataclass
class Chooser:
    """How the half not being trained decides: frozen actors, else a fixed depth / size."""

    log: ReplayLog
    depth_net: torch.nn.Module | None = None
    size_net: torch.nn.Module | None = None
    fixed_depth: int = 4
    fixed_size: int = 60
    check_every: int = 1

    def depth(self, position: int) -> int:
        shape = self.log.shape
        if self.depth_net is None:
            return min(self.fixed_depth, shape.max_depth)
        depth = 1
        while depth < shape.max_depth:
            if depth % self.check_every == 0:
                obs = depth_obs(self.log, position, depth)
                if argmax(self.depth_net, obs) != CONTINUE:
                    break
            depth += 1
        return depth

    def size(self, position: int, depth: int) -> int:
        shape = self.log.shape
        if self.size_net is None:
            size = self.fixed_size
        else:
            size = shape.size_of(argmax(self.size_net, size_obs(self.log, position, depth)))
        return min(size, shape.candidates(depth))


def depth_obs(log: ReplayLog, position: int, depth: int) -> np.ndarray:
    shape = log.shape
    lo = shape.candidates(depth - 1) if depth > 1 else 0
    latest = log.scores[position, lo : shape.candidates(depth)]
    return depth_observation(latest, int(log.context_len[position]), depth, shape)


def size_obs(log: ReplayLog, position: int, depth: int) -> np.ndarray:
    scores = log.scores[position, : log.shape.candidates(depth)]
    return size_observation(scores, int(log.context_len[position]), depth, log.shape)


class _ReplayEnv(gym.Env):
    def __init__(self, log: ReplayLog, cost: CostModel, chooser: Chooser, kind: str, seed: int):
        require(kind in REWARDS, f"reward must be one of {', '.join(REWARDS)}, got {kind!r}")
        self.log, self.cost, self.chooser, self.kind = log, cost, chooser, kind
        self.rng = np.random.default_rng(seed)
        self.position = 0

    def _cycle(self, depth: int, size: int) -> tuple[float, dict]:
        size = min(size, self.log.shape.candidates(depth))
        accepted = self.log.accepted(self.position, depth, size)
        ms = self.cost.cycle_ms(depth, size, int(self.log.context_len[self.position]))
        info = {"cycle": {"depth": depth, "size": size, "accepted": accepted, "ms": ms}}
        return reward(self.kind, accepted, ms), info


class SizeEnv(_ReplayEnv):
    """Choose V for a tree of random (or depth-policy) depth at a random recorded position."""

    def __init__(self, log, cost, chooser: Chooser, kind: str = "throughput", seed: int = 0):
        super().__init__(log, cost, chooser, kind, seed)
        shape = log.shape
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (shape.size_features,), np.float32)
        self.action_space = gym.spaces.Discrete(shape.size_actions)
        self.depth = 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.position = int(self.rng.integers(len(self.log)))
        if self.chooser.depth_net is None:
            self.depth = int(self.rng.integers(1, self.log.shape.max_depth + 1))
        else:
            self.depth = self.chooser.depth(self.position)
        return size_obs(self.log, self.position, self.depth), {}

    def step(self, action):
        value, info = self._cycle(self.depth, self.log.shape.size_of(int(action)))
        return size_obs(self.log, self.position, self.depth), value, True, False, info


class DepthEnv(_ReplayEnv):
    """Continue or stop after each level along the recorded decoding trajectories."""

    def __init__(self, log, cost, chooser: Chooser, kind: str = "throughput", seed: int = 0):
        super().__init__(log, cost, chooser, kind, seed)
        shape = log.shape
        self.observation_space = gym.spaces.Box(
            -np.inf, np.inf, (shape.depth_features,), np.float32
        )
        self.action_space = gym.spaces.Discrete(2)
        self.starts = np.flatnonzero(np.r_[True, np.diff(log.prompt) != 0])
        self.next_position: int | None = None
        self.depth = 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        if self.next_position is None:
            self.next_position = int(self.rng.choice(self.starts))
        self.position, self.depth = self.next_position, 1
        return depth_obs(self.log, self.position, 1), {}

    def step(self, action):
        if int(action) == CONTINUE and self.depth < self.log.shape.max_depth:
            self.depth += 1
            return depth_obs(self.log, self.position, self.depth), 0.0, False, False, {}
        size = self.chooser.size(self.position, self.depth)
        value, info = self._cycle(self.depth, size)
        following = self.position + info["cycle"]["accepted"] + 1
        same = (
            following < len(self.log)
            and self.log.prompt[following] == self.log.prompt[self.position]
        )
        self.next_position = following if same else None
        return depth_obs(self.log, self.position, self.depth), value, True, False, info


def replay_throughput(log: ReplayLog, cost: CostModel, chooser: Chooser) -> dict:
    """Decode every prompt of `log` along its trajectory with the chooser's (deterministic)
    decisions: tokens per second by the cost model, mean depth, size and accepted length."""
    tokens = ms = cycles = depth_sum = size_sum = accepted_sum = 0
    for prompt in np.unique(log.prompt):
        positions = np.flatnonzero(log.prompt == prompt)
        position, last = int(positions[0]), int(positions[-1])
        while position <= last:
            depth = chooser.depth(position)
            size = chooser.size(position, depth)
            accepted = log.accepted(position, depth, size)
            ms += cost.cycle_ms(depth, size, int(log.context_len[position]))
            tokens += accepted + 1
            cycles += 1
            depth_sum, size_sum = depth_sum + depth, size_sum + size
            accepted_sum += accepted
            position += accepted + 1
    return {
        "tokens_per_s": 1000 * tokens / ms if ms else 0.0,
        "depth": depth_sum / max(cycles, 1),
        "size": size_sum / max(cycles, 1),
        "accepted": accepted_sum / max(cycles, 1),
        "cycles": cycles,
    }


def plain_throughput(log: ReplayLog, cost: CostModel) -> float:
    """Replay tokens/s of plain decoding over `log`'s positions: one one-token forward each."""
    return 1000 * len(log) / sum(cost.verify(1, int(c)) for c in log.context_len)


def choice_outcomes(
    log: ReplayLog,
    cost: CostModel,
    depths: Sequence[int],
    sizes: Sequence[int],
    skip: bool = False,
) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
    """The (depth, V) choices among `depths` × `sizes` (with `skip`, first the choice to draft
    nothing: depth 0, V 0, a plain one-token step), and at every position of `log` each choice's
    tokens (accepted + 1) and cycle time in ms: [positions, choices] arrays."""
    shape = log.shape
    choices = sorted({(d, min(v, shape.candidates(d))) for d in depths for v in sizes})
    choices = [(0, 0)] * skip + choices
    depth_of = np.array([d for d, _ in choices])
    size_of = np.array([v for _, v in choices])
    ranks = log.path_ranks[:, np.maximum(depth_of - 1, 0), :]  # [positions, choices, path node]
    tokens = (ranks < size_of[None, :, None]).sum(axis=-1) + 1
    contexts = [int(c) for c in log.context_len]

    def cycle_ms(depth: int, size: int, context: int) -> float:
        return cost.cycle_ms(depth, size, context) if depth else cost.verify(1, context)

    ms_by_context = {
        context: [cycle_ms(d, v, context) for d, v in choices] for context in set(contexts)
    }
    return choices, tokens, np.array([ms_by_context[context] for context in contexts])


def hindsight_throughput(
    log: ReplayLog,
    cost: CostModel,
    depths: Sequence[int],
    sizes: Sequence[int],
    skip: bool = False,
) -> dict:
    """The best replay tokens/s that any chooser of (depth, V) among `depths` × `sizes` could
    reach on `log`, knowing each cycle's outcome beforehand: the ceiling on what a learned
    chooser with these choices can gain over the best static one (replay_throughput's output,
    for that trajectory). `skip`: a cycle may also draft nothing (depth 0, V 0: a plain
    one-token step), the ceiling of a chooser that may stop speculating where it loses
    (bench.hindsight)."""
    choices, tokens, ms = choice_outcomes(log, cost, depths, sizes, skip)
    depth_of = np.array([d for d, _ in choices])
    size_of = np.array([v for _, v in choices])
    rate, steps, picks = hindsight_rate(tokens, ms, log.prompt)
    return {
        "tokens_per_s": 1000 * rate,
        "depth": float(depth_of[picks].mean()),
        "size": float(size_of[picks].mean()),
        "accepted": float((tokens[steps, picks] - 1).mean()),
        "cycles": len(steps),
    }


def static_grid(log: ReplayLog, cost: CostModel, sizes=(*range(1, 33), 48, 60, 80, 120)):
    """Replay tokens/s of every static (depth, V): the best fixed tree on these positions. Every
    V to 32: T_verify can step between neighbours (on the AVX-512-bf16 EPYC in bf16, 16
    candidates and the root cost 1.5x 15 and the root, BENCHMARKS §11.6), so a coarse grid can
    miss the best static tree by a whole step."""
    results = []
    for depth in range(1, log.shape.max_depth + 1):
        for size in sizes:
            if size <= log.shape.candidates(depth):
                chooser = Chooser(log, fixed_depth=depth, fixed_size=size)
                results.append({**replay_throughput(log, cost, chooser), "depth": depth,
                                "size": size})  # fmt: skip
    return results
