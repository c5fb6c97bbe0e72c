"""Self-distillation data for the feature drafter: the target answers the training prompts.

EAGLE-style drafters learn the target's own continuations (EAGLE-3 trains on responses the
target regenerated), so the data is the target's answer to each training prompt, decoded by the
project's own batched engine: greedy by default, or sampled at a temperature (the contexts a
drafter meets when serving sampled requests), each prompt with its own seed so that a resumed
run samples what an uninterrupted one would. Prompts come from training sets only: the
benchmark sets (MT-Bench, HumanEval, GSM8K test) are refused by name, so no benchmark prompt is
ever trained on.

The output is one JSONL line per answered prompt (`id`, `prompt_ids`, `response_ids`,
`finish_reason`, `temperature`), appended and fsynced batch by batch: a run that is stopped
resumes by re-running the same command, skipping the ids already answered (a torn last line is
dropped).
"""

from __future__ import annotations

import json
import os
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from specpilot.config import GenerationConfig, SamplingConfig, require
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.models.chat import Messages, encode_prompt, eos_token_ids
from specpilot.prompts import read_jsonl, read_prompts_file
from specpilot.training.eagle.answer_features import FeatureRecorder
from specpilot.training.eagle.feature_cache import FeatureCache

TRAIN_SOURCES = ("sharegpt_sample.jsonl", "alpaca_sample.jsonl", "gsm8k_train.jsonl")
"""Training prompt files in ../shared/data (interleaved, so any prefix of a run mixes them)."""
BENCHMARK_SOURCES = frozenset({"mt_bench_question.jsonl", "humaneval.jsonl", "gsm8k_test.jsonl"})
HELD_OUT = {"alpaca_sample": frozenset(str(i) for i in range(773, 805))}
"""Rows of a training file that are benchmark prompts all the same, never trained on: the last
32 AlpacaEval instructions are the held-out batch prompts (docs/bench/heldout_alpaca_32.jsonl)."""
RESPONSES_FILE = "responses.jsonl"


@dataclass(frozen=True)
class Sample:
    """One training sequence: the chat-formatted prompt and the target's answer."""

    id: str
    prompt_ids: list[int]
    response_ids: list[int]

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids


@dataclass(frozen=True)
class DataOptions:
    data_dir: str = "../shared/data"
    sources: tuple[str, ...] = TRAIN_SOURCES
    max_prompts: int = 2000
    """Prompts answered in all (taken round-robin from the sources)."""
    skip: int = 0
    """Leading prompts of that order left out: a later run answers new prompts, not those an
    earlier run answered (and the head it trained on them has learned)."""
    max_new_tokens: int = 384
    max_prompt_tokens: int = 1536
    """Longer prompts are skipped (not cut: a cut chat prompt is not a real request)."""
    batch_size: int = 16
    temperature: float = 0.0
    """The target's answers are sampled at this temperature (0: greedy)."""

    def __post_init__(self) -> None:
        require(self.max_prompts >= 1, f"max_prompts must be >= 1, got {self.max_prompts}")
        require(self.skip >= 0, f"the prompts skipped must be >= 0, got {self.skip}")
        require(self.max_new_tokens >= 1, "max_new_tokens must be >= 1")
        require(self.max_prompt_tokens >= 1, "max_prompt_tokens must be >= 1")
        require(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        require(
            self.temperature >= 0,
            f"the answers' temperature must be >= 0 (0 = greedy), got {self.temperature}",
        )
        benchmarks = sorted(BENCHMARK_SOURCES.intersection(Path(s).name for s in self.sources))
        require(
            not benchmarks,
            f"{', '.join(benchmarks)} is a benchmark set: training on it would make the "
            "held-out benchmarks meaningless; use training prompts (e.g. gsm8k_train.jsonl)",
        )


def training_prompts(options: DataOptions) -> list[tuple[str, str | Messages]]:
    """(id, prompt) pairs, round-robin over the sources, at most `max_prompts` after the first
    `skip` (the `HELD_OUT` rows left out). A prompt is a user message, or for a ShareGPT
    conversation's later user turns (after all its first turns, id `ID:turnN`) the conversation
    up to that turn, the dataset's own replies as the earlier assistant turns."""
    per_source = []
    for source in options.sources:
        path = Path(options.data_dir) / source
        if not path.is_file():
            raise ConfigError(
                f"training prompts not found: {path} (set data_dir to the folder holding "
                f"{', '.join(options.sources)})",
                options=("data_dir",),
            )
        stem = Path(source).stem
        held_out = HELD_OUT.get(stem, frozenset())
        prompts: list[tuple[str, str | Messages]] = [
            (f"{stem}:{r.question_id}", r.turns[0])
            for r in read_prompts_file(path)
            if str(r.question_id) not in held_out
        ]
        for index, row in enumerate(read_jsonl(path)):
            prompts += [
                (f"{stem}:{row.get('id', index)}:turn{number}", messages)
                for number, messages in _later_turns(row.get("conversations", []))
            ]
        per_source.append(prompts)
    mixed = [p for group in _round_robin(per_source) for p in group]
    return mixed[options.skip : options.skip + options.max_prompts]


def _later_turns(conversation: list[dict]) -> Iterator[tuple[int, Messages]]:
    """(turn number from 2, the messages up to that user turn) of a ShareGPT conversation."""
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
    messages: Messages = []
    users = 0
    for turn in conversation:
        role = roles.get(turn.get("from"))
        if role is None:
            return
        messages.append({"role": role, "content": turn.get("value", "")})
        users += role == "user"
        if role == "user" and users >= 2:
            yield users, list(messages)


def _round_robin(lists: list[list]) -> Iterator[list]:
    for i in range(max(len(items) for items in lists)):
        yield [items[i] for items in lists if i < len(items)]


def reference_samples(tokenizer, options: DataOptions, max_tokens: int) -> list[Sample]:
    """The training sets' own answers (ShareGPT's first reply, Alpaca's output, GSM8K's worked
    answer), chat-formatted, round-robin like `training_prompts`. Not the target's words, but
    the drafter still learns the target's distribution on them (the soft labels come from the
    target at every position), and they cost only a prefill instead of a decode."""
    per_source = []
    for source in options.sources:
        path = Path(options.data_dir) / source
        stem = Path(source).stem
        held_out = HELD_OUT.get(stem, frozenset())
        pairs = []
        for index, row in enumerate(read_jsonl(path)):
            row_id = str(row.get("id", index))
            pair = _reference_pair(row)
            if pair is not None and row_id not in held_out:
                pairs.append((f"{stem}:{row_id}:ref", *pair))
        per_source.append(pairs)
    samples = []
    for sample_id, user, answer in (p for group in _round_robin(per_source) for p in group):
        prompt_ids = encode_prompt(tokenizer, user)
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
                tokenize=False,
            )
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
        else:  # a base model: the answer simply continues the prompt
            ids = prompt_ids + tokenizer(" " + answer, add_special_tokens=False)["input_ids"]
            ids = ids[:max_tokens]
        if len(prompt_ids) > options.max_prompt_tokens or ids[: len(prompt_ids)] != prompt_ids:
            continue
        if len(ids) > len(prompt_ids):
            samples.append(Sample(sample_id, prompt_ids, ids[len(prompt_ids) :]))
        if len(samples) >= options.max_prompts:
            break
    return samples


def _reference_pair(row: dict) -> tuple[str, str] | None:
    """(user message, reference answer) of a training-set row, None if it has none."""
    if "conversations" in row:
        turns = row["conversations"]
        if len(turns) >= 2 and turns[0].get("from") == "human" and turns[1].get("from") == "gpt":
            return turns[0]["value"], turns[1]["value"]
        return None
    if "instruction" in row and row.get("output"):
        extra = row.get("input") or ""
        return row["instruction"] + (f"\n\n{extra}" if extra else ""), row["output"]
    if "question" in row and "answer" in row:  # GSM8K: drop the <<calculator>> annotations
        return row["question"], re.sub(r"<<[^>]*>>", "", row["answer"])
    return None


def read_samples(folder: str | Path) -> list[Sample]:
    """The answered prompts of a data folder (a torn last line from an interrupted run skipped)."""
    rows = _rows(Path(folder) / RESPONSES_FILE)
    return [Sample(row["id"], row["prompt_ids"], row["response_ids"]) for row in rows]


def _rows(path: Path) -> Iterator[dict]:
    """The JSON rows of a responses file (none if it is missing; unreadable lines skipped)."""
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def generate_responses(
    engine: SpeculativeEngine,
    options: DataOptions,
    folder: str | Path,
    progress: bool = True,
    recorder: FeatureRecorder | None = None,
) -> list[Sample]:
    """Answer every training prompt not yet in `folder` (batched, greedy or sampled at
    `options.temperature`); return all samples. `recorder`: the engine's target pass, which
    writes each batch's features to its cache (answer_features.py)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RESPONSES_FILE
    _drop_torn_line(path)
    answered = list(_rows(path))
    _check_temperature(path, answered, options.temperature)
    done = {row["id"] for row in answered}
    todo = []
    for prompt_id, text in training_prompts(options):
        if prompt_id in done:
            continue
        ids = encode_prompt(engine.tokenizer, text)
        if len(ids) <= options.max_prompt_tokens:
            todo.append((prompt_id, ids))
    bar = tqdm(total=len(done) + len(todo), initial=len(done), disable=not progress, unit="prompt")
    with path.open("a", encoding="utf-8") as out:
        for start in range(0, len(todo), options.batch_size):
            batch = todo[start : start + options.batch_size]
            configs = [_answer_config(options, prompt_id) for prompt_id, _ in batch]
            results = engine.generate_batch([ids for _, ids in batch], configs)
            answers = []
            for (prompt_id, ids), result in zip(batch, results, strict=True):
                answers.append(Sample(prompt_id, ids, result.token_ids))
                row = {
                    "id": prompt_id,
                    "prompt_ids": ids,
                    "response_ids": result.token_ids,
                    "finish_reason": result.finish_reason,
                    "temperature": options.temperature,
                }
                out.write(json.dumps(row) + "\n")
            out.flush()
            os.fsync(out.fileno())
            if recorder is not None:
                recorder.store(answers)
            bar.update(len(batch))
    bar.close()
    return read_samples(folder)


def _answer_config(options: DataOptions, prompt_id: str) -> GenerationConfig:
    """How one prompt is answered: its seed comes from its id, so the sampled answer does not
    depend on the batch it falls in (or on a resume) and prompts do not share random draws."""
    return GenerationConfig(
        max_new_tokens=options.max_new_tokens,
        sampling=SamplingConfig(temperature=options.temperature),
        seed=zlib.crc32(prompt_id.encode()),
    )


def _check_temperature(path: Path, answered: list[dict], temperature: float) -> None:
    """Refuse to add answers at one temperature to a file (`path`, its rows `answered`) holding
    answers at another (the data would mix two regimes without saying so); answers written
    before the field was recorded were greedy."""
    found = {row.get("temperature", 0.0) for row in answered}
    other = sorted(t for t in found if t != temperature)
    if other:
        raise ConfigError(
            f"{path} holds answers sampled at temperature {other[0]:g} and this run asks for "
            f"{temperature:g}: answer at the same temperature, or use another out folder",
            options=("gen_temperature", "out"),
        )


def _drop_torn_line(path: Path) -> None:
    """Cut a half-written last line left by a killed run, so appends start on a fresh line."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def collect_samples(
    target,
    data: DataOptions,
    regenerate: int,
    reference: int,
    folder: str | Path,
    max_tokens: int,
    progress: bool = True,
    answered: list[Sample] | None = None,
    answerer=None,
    feature_cache: FeatureCache | None = None,
) -> list[Sample]:
    """The training sequences of a run: the training-set reference answers (`reference`, cheap)
    followed by the target's answers to `regenerate` prompts, generated into `folder`
    (resumable) by `answerer` (a loaded copy of the target on a faster backend; default: `target`
    itself), or the `answered` ones another run generated. The target's own answers come last,
    so a held-out slice taken from the end is the target's. `feature_cache` (the target's):
    where the target answers itself, its features of each answer are kept there as it writes
    them, and training reads them instead of prefilling the answer again."""
    regenerated = answered or []
    if answered is None and regenerate > 0:
        model = answerer or target
        recorder = None
        if feature_cache is not None and answerer is None:
            recorder = FeatureRecorder(target.runner, feature_cache.feature_layers, feature_cache)
        elif feature_cache is not None:
            print(
                "data: answers written on another backend keep no features; training prefills "
                "each once into the feature cache",
                file=sys.stderr,
            )
        engine = SpeculativeEngine(
            model.runner,
            model.tokenizer,
            eos_ids=eos_token_ids(model.tokenizer, model.path),
            target_pass=recorder,
        )
        options = DataOptions(**{**vars(data), "max_prompts": regenerate})
        print(f"data: the target answers {regenerate} training prompts", file=sys.stderr)
        regenerated = generate_responses(engine, options, folder, progress, recorder)
    references = []
    if reference > 0:
        options = DataOptions(**{**vars(data), "max_prompts": reference})
        references = reference_samples(target.tokenizer, options, max_tokens)
    samples = references + regenerated
    print(
        f"training on {len(samples)} sequences ({len(regenerated)} answered by the target), "
        f"{sum(len(s.response_ids) for s in samples)} response tokens",
        file=sys.stderr,
    )
    return samples
