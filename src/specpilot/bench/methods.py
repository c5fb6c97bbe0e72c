"""Benchmark methods, parsed from `NAME[:key=value,...]` strings.

- `ar`: plain autoregressive decoding through specpilot's runner (the baseline, always run);
- `default`: exactly what `specpilot generate` runs with no method flags;
- `sd:drafter=NAME,policy=NAME,<options>`: specpilot speculative decoding, the options named as
  the CLI flags are (`sd:drafter=eagle,tree_depth=4`); no policy: generate's default
  (methods.MethodSpec parses these three);
- `hf`: transformers' own `generate` (plain greedy/sampling), the reference AR implementation;
- `hf-assisted:schedule=constant|heuristic|dynamic,k=N`: transformers assisted generation with the
  same draft weights (`dynamic` is transformers' default confidence-threshold schedule);
- `hf-pld:k=N`: transformers prompt lookup decoding;
- `llama-cpp[:spec=KIND,...]`: llama.cpp's native binary on the same GGUF (bench.llama_cpp_peer).

Every method answers a batch of conversations turn by turn and returns, per conversation and
turn, the new token ids, the wall time and (for specpilot methods) the engine's statistics. With
a batch of B conversations each row is charged 1/B of its batch's wall time, so Σ tokens ÷
Σ seconds is the batch's throughput (goodput). transformers' assisted generation and prompt
lookup only run batches of one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specpilot.api import ModelPair, build_engine
from specpilot.bench import llama_cpp_peer
from specpilot.config import GenerationConfig
from specpilot.engine import GenerationStats
from specpilot.errors import ConfigError
from specpilot.methods import MethodSpec
from specpilot.methods.defaults import DEFAULT_TARGET
from specpilot.methods.spec import ENGINE_METHODS
from specpilot.models.chat import encode_prompt, eos_token_ids
from specpilot.models.hf_adapter import generate_options
from specpilot.prompts import answer_conversations

METHOD_KINDS = (*ENGINE_METHODS, "hf", "hf-assisted", "hf-pld", "llama-cpp")


@dataclass(frozen=True)
class BenchMethod:
    text: str
    """The method string as given, used as its name in reports."""
    kind: str
    options: dict[str, str] = field(default_factory=dict)
    spec: MethodSpec | None = None
    """What specpilot's engine runs (None for transformers' methods)."""

    @property
    def needs_draft(self) -> bool:
        if self.kind == "llama-cpp":
            return llama_cpp_peer.needs_draft(self.options)
        return self.kind == "hf-assisted" or (self.spec is not None and self.spec.needs_draft)


def split_method(text: str) -> tuple[str, dict[str, str]]:
    """`NAME[:key=value,...]` → its name and options as written (nothing else is checked)."""
    kind, _, rest = text.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"method {text!r}: options must be key=value, got {item!r}")
        options[key.strip()] = value.strip()
    return kind, options


def parse_method(text: str, target: str = DEFAULT_TARGET) -> BenchMethod:
    """A bench method string; `default` and `sd` without a drafter draft as `target`'s default
    (methods.defaults.default_drafter)."""
    kind, options = split_method(text)
    if kind not in METHOD_KINDS:
        raise ConfigError(
            f"unknown method {kind!r} in {text!r}; choose from {', '.join(METHOD_KINDS)}"
        )
    spec = MethodSpec.parse(text, target) if kind in ENGINE_METHODS else None
    return BenchMethod(text, kind, options, spec)


@dataclass
class TurnRun:
    token_ids: list[int]
    seconds: float
    stats: GenerationStats | None = None


class EngineMethod:
    """`ar`, `default` and `sd`: specpilot's engine."""

    def __init__(self, method: BenchMethod, models: ModelPair):
        self.engine = build_engine(models, method.spec)

    def run(self, conversations, config: GenerationConfig) -> list[list[TurnRun]]:
        # Cold start: methods share runners and run the same prompts back to back, so without
        # this every method but the first would find the prompt cached. Turns after the first
        # still reuse their conversation's prefix, as in serving.
        self.engine.clear_cache()
        results = answer_conversations(self.engine, conversations, config)
        runs: list[list[TurnRun]] = [[] for _ in conversations]
        for t in range(max(len(r) for r in results)):
            live = [i for i, r in enumerate(results) if t < len(r)]
            wall = max(results[i][t].stats.total_s for i in live)
            for i in live:
                turn = results[i][t]
                runs[i].append(TurnRun(turn.token_ids, wall / len(live), turn.stats))
        return runs


class HFMethod:
    """transformers `generate`, optionally with an assistant model or prompt lookup."""

    def __init__(self, spec: BenchMethod, models: ModelPair, hf_models: dict):
        self.tokenizer = models.target.tokenizer
        self.model = hf_models["target"]
        self.eos = sorted(eos_token_ids(self.tokenizer, models.target.path))
        self.extra: dict = {}
        options = dict(spec.options)
        if spec.kind == "hf-assisted":
            schedule = options.pop("schedule", "dynamic")
            if schedule not in ("constant", "heuristic", "dynamic"):
                raise ConfigError(
                    f"hf-assisted schedule must be constant, heuristic or dynamic, got {schedule!r}"
                )
            dynamic = schedule == "dynamic"
            # Applied to the assistant's generation_config before every call: the draft model is
            # shared by all hf-assisted methods, and HF's heuristic schedule mutates it.
            self.assistant_settings = {
                "num_assistant_tokens": int(options.pop("k", 20 if dynamic else 5)),
                "num_assistant_tokens_schedule": "constant" if dynamic else schedule,
                "assistant_confidence_threshold": float(options.pop("threshold", 0.4))
                if dynamic
                else 0.0,
            }
            self.extra = {"assistant_model": hf_models["draft"]}
        elif spec.kind == "hf-pld":
            self.extra = {"prompt_lookup_num_tokens": int(options.pop("k", 10))}
        if options:
            raise ConfigError(f"method {spec.text!r}: unknown options {', '.join(options)}")

    @torch.inference_mode()
    def run(self, conversations, config: GenerationConfig) -> list[list[TurnRun]]:
        if len(conversations) != 1:
            raise ConfigError(
                "transformers methods (hf, hf-assisted, hf-pld) run batches of one: use "
                "batch_size 1 or drop them from the methods",
                ("batch_size", "method"),
            )
        (turns,) = conversations
        if "assistant_model" in self.extra:
            for key, value in self.assistant_settings.items():
                setattr(self.extra["assistant_model"].generation_config, key, value)
        kwargs = {**generate_options(config, self.eos), **self.extra}
        messages, runs = [], []
        for turn in turns:
            messages.append({"role": "user", "content": turn})
            ids = torch.tensor([encode_prompt(self.tokenizer, messages)], device=self.model.device)
            torch.manual_seed(config.seed)
            start = time.perf_counter()
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            seconds = time.perf_counter() - start
            new = out[0, ids.shape[1] :].tolist()
            messages.append(
                {
                    "role": "assistant",
                    "content": self.tokenizer.decode(new, skip_special_tokens=True),
                }
            )
            runs.append(TurnRun(new, seconds))
        return [runs]


def load_hf_models(models: ModelPair, specs: list[BenchMethod]) -> dict:
    """transformers copies of the same weights, in the same dtype, for the HF peers."""
    from transformers import AutoModelForCausalLM

    wanted = {"target"} if any(s.kind.startswith("hf") for s in specs) else set()
    if any(s.kind == "hf-assisted" for s in specs):
        wanted.add("draft")
    loaded = {}
    for role in sorted(wanted):
        source = getattr(models, role)
        loaded[role] = (
            AutoModelForCausalLM.from_pretrained(
                source.path, dtype=source.runner.dtype, device_map=None
            )
            .to(source.runner.device)
            .eval()
        )
    return loaded


def make_method(spec: BenchMethod, models: ModelPair, hf_models: dict):
    if spec.spec is not None:
        return EngineMethod(spec, models)
    if spec.kind == llama_cpp_peer.KIND:
        return llama_cpp_peer.LlamaCppMethod(spec, models)
    return HFMethod(spec, models, hf_models)
