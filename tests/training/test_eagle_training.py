"""train-eagle's pieces: data selection and resume, the training-time-test mask and loss, the
teacher-forced accepted length, and a resumable training run on a tiny target."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from eagle_fixtures import WORDS, TinyLoaded, tiny_target
from tiny import cpu_training, tiny_tokenizer

from specpilot.drafting.eagle_head import EagleShape
from specpilot.engine import SpeculativeEngine
from specpilot.errors import ConfigError
from specpilot.models.decoder import DecoderRunner
from specpilot.models.loading import cpu_has_native_bf16
from specpilot.training.eagle.data import (
    HELD_OUT,
    RESPONSES_FILE,
    DataOptions,
    Sample,
    generate_responses,
    read_samples,
    reference_samples,
    training_prompts,
)
from specpilot.training.eagle.features import require_cpu_target
from specpilot.training.eagle.losses import chain_accepted_length, training_time_test_mask
from specpilot.training.eagle.trainer import LOG_FILE, EagleTrainConfig, train_eagle


def test_benchmark_sets_are_refused():
    with pytest.raises(ConfigError, match="benchmark set"):
        DataOptions(sources=("gsm8k_train.jsonl", "gsm8k_test.jsonl"))


def test_held_out_alpaca_prompts_are_never_trained_on(tmp_path):
    """The held-out batch prompts (docs/bench/heldout_alpaca_32.jsonl) are AlpacaEval rows: the
    training prompts and reference answers leave exactly those rows out."""
    held_file = Path(__file__).parents[2] / "docs/bench/heldout_alpaca_32.jsonl"
    held = {json.loads(line)["question_id"] for line in held_file.read_text().splitlines()}
    assert {f"alpaca:{i}" for i in HELD_OUT["alpaca_sample"]} == held
    rows = [{"id": i, "instruction": "w5 w6", "input": "", "output": "w7"} for i in (772, 773, 804)]
    (tmp_path / "alpaca_sample.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    options = DataOptions(data_dir=str(tmp_path), sources=("alpaca_sample.jsonl",))
    assert [pid for pid, _ in training_prompts(options)] == ["alpaca_sample:772"]
    samples = reference_samples(_chat_tokenizer(), options, max_tokens=64)
    assert [s.id for s in samples] == ["alpaca_sample:772:ref"]


def test_sharegpt_later_turns_follow_the_first_turns_with_their_context(tmp_path):
    """Each later user turn of a ShareGPT conversation is a prompt of its own, after every
    conversation's first turn: the conversation so far, the dataset's replies as context."""

    def turns(*texts):
        return [{"from": ("human", "gpt")[i % 2], "value": t} for i, t in enumerate(texts)]

    rows = [
        {"id": "c1", "conversations": turns("q1", "a1", "q2", "a2", "q3", "a3")},
        {"id": "c2", "conversations": turns("p1", "b1")},
    ]
    (tmp_path / "sharegpt_sample.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    options = DataOptions(data_dir=str(tmp_path), sources=("sharegpt_sample.jsonl",))
    prompts = training_prompts(options)
    assert [pid for pid, _ in prompts] == [
        "sharegpt_sample:c1",
        "sharegpt_sample:c2",
        "sharegpt_sample:c1:turn2",
        "sharegpt_sample:c1:turn3",
    ]
    assert prompts[0][1] == "q1"
    roles = ("user", "assistant", "user", "assistant", "user")
    texts = ("q1", "a1", "q2", "a2", "q3")
    assert prompts[3][1] == [
        {"role": role, "content": text} for role, text in zip(roles, texts, strict=True)
    ]


def test_torn_last_line_is_skipped(tmp_path):
    good = json.dumps({"id": "a", "prompt_ids": [1], "response_ids": [2, 3]})
    (tmp_path / RESPONSES_FILE).write_text(good + "\n" + '{"id": "b", "prom')
    assert [s.id for s in read_samples(tmp_path)] == ["a"]


def test_training_prompts_interleave_the_sources_after_the_skipped_ones(tmp_path):
    for name, count in (("a.jsonl", 3), ("b.jsonl", 1)):
        rows = [{"question": f"{name} {i}", "answer": "x"} for i in range(count)]
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in rows))
    options = DataOptions(data_dir=str(tmp_path), sources=("a.jsonl", "b.jsonl"))
    ids = [prompt_id for prompt_id, _ in training_prompts(options)]
    assert ids == ["a:0", "b:0", "a:1", "a:2"]
    later = DataOptions(data_dir=str(tmp_path), sources=("a.jsonl", "b.jsonl"), skip=2)
    assert [prompt_id for prompt_id, _ in training_prompts(later)] == ids[2:]
    with pytest.raises(ConfigError, match="skipped must be >= 0"):
        DataOptions(skip=-1)


def _chat_tokenizer():
    """The tiny tokenizer with a chat template: messages joined, "w4" opening each answer."""
    tokenizer = tiny_tokenizer(WORDS)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}w4 {% endif %}"
        "{{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}w4 {% endif %}"
    )
    return tokenizer


def test_reference_samples_split_prompt_and_answer(tmp_path):
    rows = [{"question": "w5 w6", "answer": "w7 <<1+1=2>>w8 w9"}]
    (tmp_path / "gsm8k_train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    tokenizer = _chat_tokenizer()
    options = DataOptions(data_dir=str(tmp_path), sources=("gsm8k_train.jsonl",))
    with pytest.raises(ConfigError, match="training prompts not found"):
        training_prompts(DataOptions(data_dir=str(tmp_path / "none")))
    (sample,) = reference_samples(tokenizer, options, max_tokens=64)
    assert tokenizer.decode(sample.prompt_ids) == "w5 w6 w4"
    assert tokenizer.decode(sample.response_ids) == "w7 w8 w9"


def test_sampled_answers_follow_the_prompt_not_the_batch_and_keep_one_temperature(tmp_path):
    """Each prompt's answer is sampled with its own seed: a run with another batch size (or a
    resumed one) writes the same answers; a folder never mixes temperatures."""
    rows = [{"question": f"w{5 + i} w{30 + i}", "answer": "x"} for i in range(3)]
    (tmp_path / "gsm8k_train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    runner = DecoderRunner(tiny_target(torch.float32), max_length=64, batch_size=3)
    engine = SpeculativeEngine(runner, _chat_tokenizer(), eos_ids=set())

    def answer(folder, batch_size, temperature=1.0):
        options = DataOptions(
            data_dir=str(tmp_path),
            sources=("gsm8k_train.jsonl",),
            max_new_tokens=8,
            batch_size=batch_size,
            temperature=temperature,
        )
        return generate_responses(engine, options, tmp_path / folder, progress=False)

    together = answer("a", batch_size=3)
    assert answer("b", batch_size=1) == together
    assert len({tuple(s.response_ids) for s in together}) == 3
    path = tmp_path / "a" / RESPONSES_FILE
    lines = path.read_text().splitlines()
    assert {json.loads(line)["temperature"] for line in lines} == {1.0}
    path.write_text("\n".join(lines[:1]) + "\n")  # as a run stopped after its first answer
    assert answer("a", batch_size=2) == together
    with pytest.raises(ConfigError, match="sampled at temperature 1 and this run asks for 0"):
        answer("a", batch_size=3, temperature=0.0)
    with pytest.raises(ConfigError, match="temperature must be >= 0"):
        DataOptions(temperature=-1.0)


def test_training_time_test_mask():
    allowed = training_time_test_mask(4, 2, torch.float32) == 0
    # step 2, position t: step-1 keys s <= t - 1, and its own step-2 key s == t
    assert allowed[:, :4].tolist() == [[s <= t - 1 for s in range(4)] for t in range(4)]
    assert allowed[:, 4:].tolist() == [[s == t for s in range(4)] for t in range(4)]


def test_chain_accepted_length_counts_consecutive_hits():
    valid = [torch.ones(4, dtype=torch.bool)] * 2
    step1 = torch.tensor([True, False, True, True])
    step2 = torch.tensor([False, True, True, False])  # read at t + 1
    # t=0: step1 hit, step2 at 1 hit → 3; t=1: miss → 1; t=2: hit, step2 at 3 miss → 2;
    # t=3: hit, step2 past the end → 2
    assert chain_accepted_length([step1, step2], valid) == pytest.approx((3 + 1 + 2 + 2) / 4)


@cpu_training
def test_training_lowers_the_loss_and_resumes(tmp_path):
    target = TinyLoaded(tiny_target(torch.float32))
    generator = torch.Generator().manual_seed(0)
    samples = [
        Sample(f"s{i}", [1, 5, 6], torch.randint(4, 96, (20,), generator=generator).tolist())
        for i in range(12)
    ]
    shape = EagleShape.for_target(target.runner, target.tokenizer)
    config = EagleTrainConfig(
        epochs=2, lr=3e-3, warmup=1, batch_tokens=32, valid_samples=2, eval_every=4, save_every=3
    )
    head = train_eagle(target, samples, tmp_path, config, shape, progress=False)
    rows = (tmp_path / LOG_FILE).read_text().splitlines()
    losses = [float(r.split(",")[3]) for r in rows[1:] if r.split(",")[3]]
    assert losses[-1] < losses[0]
    entropies = [float(r["val_entropy"]) for r in csv.DictReader(rows) if r["val_entropy"]]
    assert entropies and all(0 < e <= math.log(shape.draft_vocab_size) + 1e-4 for e in entropies)
    overlaps = [float(r["val_overlap"]) for r in csv.DictReader(rows) if r["val_overlap"]]
    assert len(overlaps) == len(entropies) and all(0 < o <= 1 + 1e-4 for o in overlaps)
    assert (tmp_path / "head" / "eagle_config.json").is_file()
    assert (tmp_path / "learning_curve.png").is_file()
    # Re-running the finished command resumes at the end and changes nothing; how often it
    # evaluates and saves, and whether it autocasts to bf16 (the machine's), may change.
    resumed = dataclasses.replace(
        config, eval_every=9, save_every=1, bf16=not cpu_has_native_bf16()
    )
    again = train_eagle(target, samples, tmp_path, resumed, shape, progress=False)
    for a, b in zip(head.parameters(), again.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    narrower = dataclasses.replace(shape, intermediate_size=shape.intermediate_size // 2)
    with pytest.raises(ConfigError, match="another shape.*intermediate_size"):
        train_eagle(target, samples, tmp_path, config, narrower, progress=False)
    with pytest.raises(ConfigError, match="other settings"):
        train_eagle(
            target, samples, tmp_path, dataclasses.replace(config, lr=1e-3), shape, progress=False
        )


def test_training_refuses_a_target_off_the_cpu():
    """The head trains beside a CPU target; a GPU-loaded one is a clear error up front, not a
    device mismatch mid-run."""
    runner = SimpleNamespace(device=torch.device("cuda"))
    with pytest.raises(ConfigError, match="trains on the CPU: load the target with device='cpu'"):
        require_cpu_target(runner)
