"""Replay logs for LTD: every decoding position's full-depth draft tree and the target's answer.

Under greedy decoding what a draft–verify cycle accepts is fixed by the target's greedy
continuation: the target accepts the longest path of verified nodes that spells it. So one pass
per training prompt records, at every position t of the target's greedy answer, the feature
drafter's tree grown to the maximum depth (token, parent and cumulative score of every
candidate, in the order the tree generated them) and the next max_depth greedy tokens; the
accepted length of any (depth d, size V) choice then follows offline: the tree of depth d is the
first W + (d − 1)·W² candidates (growth is deterministic level by level), its top-V slice by
score is what the drafter would verify, and the accepted length counts the matching path's nodes
inside that slice (ancestors rank before their children, so they form a prefix). `path_ranks`
stores those ranks per depth so environments need no sorting.

The drafter's features come from one teacher-forced target forward over prompt + answer (the
answer itself is decoded speculatively: lossless, so it is the greedy answer). Each position
also records the drafter's measured cumulative time to reach each depth, for the cost model.

Shards (`shard-NNNNN.safetensors`, the prompt ids in the metadata) are written atomically every
few prompts; re-running the same command skips the prompts already recorded.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
from tqdm import tqdm

from specpilot.config import GenerationConfig, require
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.policies.draft import ConstantPolicy
from specpilot.policies.ltd_net import LtdShape
from specpilot.types import StepRecord

META_FILE = "replay.json"
NO_RANK = np.iinfo(np.int16).max
"""path_ranks entry of a path node the tree does not hold (never inside any top-V slice)."""


class _Recorder:
    """Grows every tree to full depth and timestamps each level (a TreePolicy)."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def reset(self) -> None:
        pass

    def draft_budget(self) -> int:
        return 1 << 30

    def admits(self, logits) -> bool:
        return True

    def continue_drafting(self, drafted) -> bool:
        return True

    def observe(self, record: StepRecord) -> None:
        pass

    def continue_tree(self, tree, context_len: int) -> bool:
        self.marks.append(time.perf_counter())
        return True

    def tree_size(self, tree, context_len: int) -> int | None:
        return None


def path_ranks(
    shape: LtdShape, tokens: np.ndarray, parents: np.ndarray, scores: np.ndarray, cont
) -> np.ndarray:
    """[max_depth, max_depth] int16: entry [d − 1, j] is the rank, among the candidates of the
    tree cut to d levels, of the node at depth j + 1 on the path spelling `cont` (NO_RANK where
    the path ends or lies deeper than d)."""
    path, parent = [], -1
    for depth, token in enumerate(cont[: shape.max_depth], start=1):
        lo, hi = shape.candidates(depth - 1) if depth > 1 else 0, shape.candidates(depth)
        hit = np.flatnonzero((tokens[lo:hi] == token) & (parents[lo:hi] == parent))
        if not len(hit):
            break
        parent = lo + int(hit[0])
        path.append(parent)
    ranks = np.full((shape.max_depth, shape.max_depth), NO_RANK, dtype=np.int16)
    depths = node_depths(shape)
    for d in range(1, shape.max_depth + 1):
        n = shape.candidates(d)
        order = np.lexsort((np.arange(n), depths[:n], -scores[:n]))  # as DynamicTree.ranking
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)
        for j, node in enumerate(path[:d]):
            ranks[d - 1, j] = rank[node]
    return ranks


def node_depths(shape: LtdShape) -> np.ndarray:
    """The level of each candidate of a full tree, in generation order."""
    counts = [shape.topk] + [shape.topk * shape.topk] * (shape.max_depth - 1)
    return np.repeat(np.arange(1, shape.max_depth + 1), counts)


@dataclass(frozen=True)
class RecordOptions:
    new_tokens: int = 128
    """Decoding positions recorded per prompt (the greedy answer's first tokens)."""
    shard_prompts: int = 4

    def __post_init__(self) -> None:
        require(self.new_tokens >= 1, f"new_tokens must be >= 1, got {self.new_tokens}")
        require(self.shard_prompts >= 1, f"shard_prompts must be >= 1, got {self.shard_prompts}")


def record_replay(
    target,
    tokenizer,
    drafter,
    shape: LtdShape,
    prompts: list[tuple[str, list[int]]],
    folder: str | Path,
    options: RecordOptions = RecordOptions(),
    eos_ids=frozenset(),
    progress: bool = True,
) -> None:
    """Record every prompt of `prompts` ((id, token ids)) not yet in `folder`. `target`: the
    loaded target's lean-decoder runner; `drafter`: an EagleDrafter with topk = shape.topk."""
    require(drafter.topk == shape.topk, f"the drafter's topk {drafter.topk} != {shape.topk}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = _recorded_with(shape, options.new_tokens)
    meta_path = folder / META_FILE
    recorded = _read_meta(meta_path) if meta_path.is_file() else meta
    if recorded != meta:
        raise ConfigError(
            f"{folder} holds replay logs recorded with other settings "
            f"({json.dumps(recorded)}, not {json.dumps(meta)}); "
            "use another out folder or the same settings",
            options=("out",),
        )
    meta_path.write_text(json.dumps(meta) + "\n")
    done = recorded_ids(folder)
    todo = [(pid, ids) for pid, ids in prompts if pid not in done]
    engine = SpeculativeEngine(
        target, tokenizer, drafter, ConstantPolicy(min(4, shape.max_depth)), eos_ids=eos_ids
    )
    config = GenerationConfig(max_new_tokens=options.new_tokens + shape.max_depth)
    shard = len(list(folder.glob("shard-*.safetensors")))
    rows: list[dict] = []
    ids_in_shard: list[str] = []
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), unit="prompt",
               desc="replay logs", disable=not progress)  # fmt: skip
    for pid, ids in todo:
        answer = engine.generate(list(ids), config).token_ids
        rows += _positions(target, drafter, shape, list(ids), answer, options.new_tokens)
        ids_in_shard.append(pid)
        bar.update()
        if len(ids_in_shard) == options.shard_prompts or pid == todo[-1][0]:
            _write_shard(folder / f"shard-{shard:05d}.safetensors", rows, ids_in_shard)
            shard, rows, ids_in_shard = shard + 1, [], []
    bar.close()


def _positions(target, drafter, shape: LtdShape, prompt, answer, new_tokens) -> list[dict]:
    full = prompt + answer
    target.reset()
    drafter.clear_cache()
    layers = drafter.feature_layers
    out = target.run_batch([full[:-1]], [0], logits="none", tap_layers=layers)
    taps = torch.cat([out[0].taps[k] for k in layers], dim=-1)
    target.reset()
    count, rows = 0, []
    n = shape.candidates(shape.max_depth)
    for t in range(len(prompt) - 1, min(len(prompt) - 1 + new_tokens, len(full) - 1)):
        drafter.take_features(0, count, taps[count:t], full[count:t])
        count = t
        recorder = _Recorder()
        start = time.perf_counter()
        tree = drafter.grow_tree(0, full[: t + 1], shape.max_depth, recorder)
        end = time.perf_counter()
        if len(tree.tokens) != n:
            raise ConfigError(
                f"the drafter grew {len(tree.tokens)} candidates, not {n}: its draft vocabulary "
                f"must hold at least topk = {shape.topk} tokens"
            )
        tokens = np.array([drafter.vocabulary.to_full_id(i) for i in tree.tokens], np.int32)
        parents = np.array(tree.parents, np.int32)
        scores = np.array(tree.scores, np.float32)
        cont = full[t + 1 : t + 1 + shape.max_depth]
        draft_ms = np.array([*recorder.marks, end], np.float64) - start
        rows.append(
            {
                "tokens": tokens,
                "parents": parents.astype(np.int16),
                "scores": scores,
                "cont": np.array(cont + [-1] * (shape.max_depth - len(cont)), np.int32),
                "context_len": np.array(t + 1, np.int32),
                "step": np.array(t + 1 - len(prompt), np.int32),
                "draft_ms": (draft_ms * 1000).astype(np.float32),
                "path_ranks": path_ranks(shape, tokens, parents, scores, cont),
            }
        )
    return rows


def _recorded_with(shape: LtdShape, new_tokens: int) -> dict:
    """What a recording depends on: the tree's width and depth and the positions per prompt.
    The size policy's action grid is not among them, so one recording serves every grid."""
    return {"topk": shape.topk, "max_depth": shape.max_depth, "new_tokens": new_tokens}


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text())
        if "shape" in meta:  # recorded before the grid was left out of the metadata
            meta = {**{k: meta["shape"][k] for k in ("topk", "max_depth")},
                    "new_tokens": meta["new_tokens"]}  # fmt: skip
        return {key: int(meta[key]) for key in ("topk", "max_depth", "new_tokens")}
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"{path} is not replay metadata ({type(error).__name__}: {error}); delete its folder "
            "and record the replay again (train-ltd does)"
        ) from None


def _write_shard(path: Path, rows: list[dict], prompt_ids: list[str]) -> None:
    """One shard, atomically (a prompt with no position adds no rows)."""
    tensors = {key: np.stack([row[key] for row in rows]) for key in rows[0]} if rows else {}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"prompts": json.dumps(prompt_ids)})
    os.replace(tmp, path)


def recorded_ids(folder: Path) -> set[str]:
    done: set[str] = set()
    for path in sorted(folder.glob("shard-*.safetensors")):
        with safe_open(str(path), "np") as f:
            done.update(json.loads(f.metadata()["prompts"]))
    return done


@dataclass
class ReplayLog:
    """All recorded positions, concatenated; `prompt` numbers each position's prompt."""

    shape: LtdShape
    scores: np.ndarray
    context_len: np.ndarray
    draft_ms: np.ndarray
    path_ranks: np.ndarray
    prompt: np.ndarray

    @classmethod
    def load(cls, folder: str | Path, shape: LtdShape) -> ReplayLog:
        """The logs in `folder`, read with `shape`'s size grid; its width and depth must be the
        recording's."""
        folder = Path(folder)
        meta_path = folder / META_FILE
        shards = sorted(folder.glob("shard-*.safetensors"))
        if not meta_path.is_file() or not shards:
            raise ConfigError(f"no replay logs in {folder}: record them first (train-ltd does)")
        meta = _read_meta(meta_path)
        if (meta["topk"], meta["max_depth"]) != (shape.topk, shape.max_depth):
            raise ConfigError(
                f"the replay logs in {folder} hold trees of width {meta['topk']} and depth "
                f"{meta['max_depth']}, not {shape.topk} and {shape.max_depth}"
            )
        parts: dict[str, list[np.ndarray]] = {}
        for path in shards:
            for key, value in load_file(str(path)).items():
                parts.setdefault(key, []).append(value)
        if "scores" not in parts:
            raise ConfigError(f"the replay logs in {folder} hold no positions")
        data = {key: np.concatenate(values) for key, values in parts.items()}
        prompt = np.cumsum(data["step"] == 0) - 1  # a prompt's positions are consecutive
        return cls(
            shape,
            data["scores"],
            data["context_len"],
            data["draft_ms"],
            data["path_ranks"],
            prompt,
        )

    def __len__(self) -> int:
        return len(self.scores)

    def accepted(self, position: int, depth: int, size: int) -> int:
        """Draft tokens the target accepts when the tree of `depth` levels is cut to its best
        `size` candidates at this position (greedy decoding)."""
        return int((self.path_ranks[position, depth - 1] < size).sum())

    def subset(self, prompts: np.ndarray) -> ReplayLog:
        """The positions of these prompt numbers (a train/validation split by prompt)."""
        keep = np.isin(self.prompt, prompts)
        _, prompt = np.unique(self.prompt[keep], return_inverse=True)
        return ReplayLog(
            self.shape,
            self.scores[keep],
            self.context_len[keep],
            self.draft_ms[keep],
            self.path_ranks[keep],
            prompt,
        )
