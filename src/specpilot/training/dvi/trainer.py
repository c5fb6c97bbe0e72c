"""`specpilot train-dvi`: decode a prompt stream with the DVI drafter and learn as it goes.

Generation and learning share one loop: the engine decodes each prompt (greedy verification, so
the output is the target's; drafts greedy, or sampled at `explore_temperature` > 0), every
verified block goes to the learner, and every `rollout_blocks` blocks the learner updates the
LoRA head, which drafts the next block. Each step appends a CSV row; checkpoints (PEFT adapter
+ trainer state: optimizer, replay buffer, RNG, counters, prompt position) are written
atomically between prompts, and a run restarted on the same --out resumes from the newest one.
"""

from __future__ import annotations

import csv
import os
import shutil
import sys
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specpilot.config import GenerationConfig, require
from specpilot.drafting.dvi_head import LATEST_FILE, DraftHead, LoraSettings
from specpilot.drafting.dvi_learning.config import DviTrainConfig
from specpilot.drafting.dvi_learning.learner import DviLearner
from specpilot.drafting.layer_split import LayerSplitDrafter
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError, PromptError
from specpilot.files import replace_folder
from specpilot.models import LoadedModel
from specpilot.models.chat import encode_prompt, eos_token_ids
from specpilot.models.vocab import DraftVocabulary
from specpilot.policies.draft import ConstantPolicy
from specpilot.prompts import read_jsonl, read_prompts_file

LOG_FILE = "train_log.csv"
CURVE_FILE = "learning_curve.png"
STATE_FILE = "trainer_state.pt"
LOG_COLUMNS = (
    "step", "updates", "prompt", "acceptance", "drafted", "accepted", "loss", "kl", "pg", "ce",
    "reinforce", "anchor_kl", "lambda_pg", "lambda_kl", "beta", "baseline",
)  # fmt: skip


@dataclass(frozen=True)
class TrainDviOptions:
    prompts: str
    steps: int
    out: str
    split: int = 1
    """Target layers that draft: 1 ran fastest held-out on SmolLM2-135M (BENCHMARKS.md §6.2,
    §6.7; the paper's is 2)."""
    draft_vocab: int | None = None
    draft_vocab_corpus: str | None = None
    """With draft_vocab: pick the ids most frequent in this corpus file (else the first ids)."""
    lora_rank: int = 8
    limit: int = 2000
    """Prompts read from the stream (one pass)."""
    max_new_tokens: int = 64
    """Tokens generated per prompt."""
    max_prompt_tokens: int = 512
    """Longer user messages are cut to this many tokens."""
    explore_temperature: float = 0.0
    """Temperature the rollouts sample drafts at; 0 drafts greedily, as the paper does and as
    learned faster here (BENCHMARKS.md §6.1; the authors' code samples at 1.0)."""
    draft_length: int = 4
    """k_spec: tokens drafted per block."""
    save_every: int = 100
    """Checkpoint at the first prompt boundary after this many steps."""
    keep_checkpoints: int = 2

    def __post_init__(self) -> None:
        require(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        require(self.limit >= 1, f"limit must be >= 1, got {self.limit}")
        require(self.max_new_tokens >= 1, "max_new_tokens must be >= 1")
        require(self.max_prompt_tokens >= 1, "max_prompt_tokens must be >= 1")
        require(self.explore_temperature >= 0, "explore_temperature must be >= 0")
        require(self.lora_rank >= 1, f"lora_rank must be >= 1, got {self.lora_rank}")
        require(self.draft_length >= 1, f"draft_length must be >= 1, got {self.draft_length}")
        require(self.save_every >= 1, f"save_every must be >= 1, got {self.save_every}")
        require(self.keep_checkpoints >= 1, "keep_checkpoints must be >= 1")
        require(
            not self.draft_vocab_corpus or bool(self.draft_vocab),
            "a draft vocabulary corpus needs the vocabulary's size (draft_vocab)",
            ("draft_vocab",),
        )


def read_training_prompts(path: str | Path, limit: int) -> list[str]:
    """User messages, in file order: every human turn of a ShareGPT conversation (each a prompt
    of its own), else the turns of any prompt file `read_prompts_file` reads."""
    rows = read_jsonl(path)
    if rows and "conversations" in rows[0]:
        texts = [
            m["value"]
            for row in rows
            for m in row.get("conversations", [])
            if m.get("from") in ("human", "user") and str(m.get("value", "")).strip()
        ]
    else:
        texts = [turn for record in read_prompts_file(path) for turn in record.turns]
    if not texts:
        raise PromptError(f"{path}: no prompts to train on")
    return texts[:limit]


def prompt_ids(tokenizer, text: str, max_prompt_tokens: int) -> list[int]:
    """The chat-formatted prompt, the user text first cut to `max_prompt_tokens` tokens."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) > max_prompt_tokens:
        text = tokenizer.decode(ids[:max_prompt_tokens])
    return encode_prompt(tokenizer, [{"role": "user", "content": text}])


class _StepLog:
    """CSV rows, a tqdm bar showing the acceptance of the last 20 steps, and a step counter."""

    def __init__(self, path: Path, steps: int, initial: int, progress: bool):
        from tqdm.auto import tqdm

        self.path = path
        self.prompt = 0
        self.recent: deque[float] = deque(maxlen=20)
        self.bar = tqdm(
            total=steps, initial=initial, disable=not progress, file=sys.stderr, desc="train-dvi"
        )
        if not path.exists():
            with path.open("w", newline="") as sink:
                csv.writer(sink).writerow(LOG_COLUMNS)

    def truncate(self, steps: int) -> None:
        """Keep the header and the rows of steps < `steps` (a resumed run redoes the rest)."""
        with self.path.open(newline="") as source:
            rows = list(csv.reader(source))
        kept = [rows[0]] + [row for row in rows[1:] if int(row[0]) < steps]
        with self.path.open("w", newline="") as sink:
            csv.writer(sink).writerows(kept)

    def __call__(self, metrics: dict) -> None:
        metrics = {**metrics, "prompt": self.prompt}
        with self.path.open("a", newline="") as sink:
            csv.writer(sink).writerow([_fmt(metrics.get(column, "")) for column in LOG_COLUMNS])
        self.recent.append(metrics["acceptance"])
        self.bar.update(1)
        self.bar.set_postfix(acceptance=f"{sum(self.recent) / len(self.recent):.3f}")


def _fmt(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _checkpoints(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))


def save_checkpoint(
    out: Path, head: DraftHead, learner: DviLearner, meta: dict, next_prompt: int, keep: int
) -> Path:
    """step-NNNNNN/{adapter/, trainer_state.pt}, built under a temp name and renamed; then the
    `latest` pointer is replaced atomically and older checkpoints beyond `keep` removed."""
    folder = out / f"step-{learner.step:06d}"
    tmp = out / (folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    head.save(tmp / "adapter")
    state = {"learner": learner.state_dict(), "meta": meta, "next_prompt": next_prompt}
    torch.save(state, tmp / STATE_FILE)
    replace_folder(tmp, folder)
    pointer = out / (LATEST_FILE + ".tmp")
    pointer.write_text(folder.name)
    os.replace(pointer, out / LATEST_FILE)
    for old in _checkpoints(out)[:-keep]:
        shutil.rmtree(old)
    return folder


def _resume(out: Path, head: DraftHead, learner: DviLearner, meta: dict) -> int:
    """Load the newest checkpoint into head and learner; return the next prompt's index."""
    folder = out / (out / LATEST_FILE).read_text().strip()
    try:
        state = torch.load(folder / STATE_FILE, weights_only=False)
    except (OSError, RuntimeError, EOFError) as error:
        raise ConfigError(f"checkpoint {str(folder)!r} is corrupt or incomplete: {error}") from None
    if state["meta"] != meta:
        raise ConfigError(
            f"{str(out)!r} holds a run with other settings ({state['meta']}); resume with the "
            "same options or another out folder",
            options=("out",),
        )
    head.load(folder / "adapter")
    learner.load_state_dict(state["learner"])
    return state["next_prompt"]


def train_dvi(
    target: LoadedModel,
    options: TrainDviOptions,
    config: DviTrainConfig | None = None,
    progress: bool = True,
) -> Path:
    """Train a DVI head on `target` over the prompt stream; return the output folder."""
    config = config or DviTrainConfig()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = read_training_prompts(options.prompts, options.limit)
    tokenizer, runner = target.tokenizer, target.runner
    token_ids = None
    if options.draft_vocab:
        token_ids = DraftVocabulary.select(
            options.draft_vocab, tokenizer, runner.vocab_size, options.draft_vocab_corpus
        ).token_ids
    torch.manual_seed(config.seed)  # the LoRA initialisation and dropout draw from it
    head = DraftHead(runner, options.split, LoraSettings(rank=options.lora_rank), token_ids)
    meta = {
        "target": str(target.path),
        "options": {k: v for k, v in asdict(options).items() if k not in ("steps", "out")},
        "config": asdict(config),
    }
    config.save(out)
    learner = DviLearner(head, config, max_steps=options.steps)
    start = 0
    resuming = (out / LATEST_FILE).is_file()
    if resuming:
        start = _resume(out, head, learner, meta)
    log = _StepLog(out / LOG_FILE, options.steps, learner.step, progress)
    if resuming:
        log.truncate(learner.step)
    learner.on_step = log
    drafter = LayerSplitDrafter(
        runner, head, explore_temperature=options.explore_temperature, learner=learner
    )
    engine = SpeculativeEngine(
        drafter.target,
        tokenizer,
        drafter,
        ConstantPolicy(options.draft_length),
        eos_ids=eos_token_ids(tokenizer, target.path),
    )
    saved, next_prompt = learner.step, start
    while next_prompt < len(prompts) and not learner.done:
        log.prompt = next_prompt
        ids = prompt_ids(tokenizer, prompts[next_prompt], options.max_prompt_tokens)
        generation = GenerationConfig(options.max_new_tokens, seed=config.seed + next_prompt)
        engine.generate(ids, generation)
        next_prompt += 1
        if learner.step - saved >= options.save_every:
            save_checkpoint(out, head, learner, meta, next_prompt, options.keep_checkpoints)
            saved = learner.step
    if learner.step != saved or not resuming:
        save_checkpoint(out, head, learner, meta, next_prompt, options.keep_checkpoints)
    log.bar.close()
    from specpilot.bench.plots import dvi_learning_curves

    dvi_learning_curves([out / LOG_FILE], [config.objective], out / CURVE_FILE)
    return out
