"""The `llama-cpp` bench peer: llama.cpp's own native decoding of the same GGUF, same prompt ids,
same thread count, greedy or the same sampling settings.

- `llama-cpp`: plain decoding (llama-server, no speculation);
- `llama-cpp:spec=KIND[,n_max=N,n_min=N]`: its speculative modes, KIND one of `SPEC_TYPES`
  (`draft` is `draft-simple` with the bench's draft GGUF);
- `llama-cpp:spec=eagle3[,eagle_head=DIR|NAME,n_max=N,n_min=N]`: `draft-eagle3` with specpilot's
  eagle head (default: the target's committed one) converted to llama.cpp's EAGLE3 GGUF
  (bench.llama_cpp_eagle3, which also says what this llama.cpp refuses).

The speculative modes report acceptance: llama-server's response timings carry the request's
drafted and accepted totals (`draft_n`, `draft_n_accepted`; `turn_stats` says what the bench rows
make of them). The binaries come from scripts/build_llama_cpp.sh; without them the method is
skipped with one line.
"""

from __future__ import annotations

import atexit
from pathlib import Path

import torch

from specpilot.bench.llama_server import (
    BUILD_HINT,
    LlamaServer,
    binary_dir,
    completion_request,
    find_binary,
)
from specpilot.config import GenerationConfig
from specpilot.engine import GenerationStats
from specpilot.errors import ConfigError
from specpilot.models.chat import encode_prompt
from specpilot.types import StepRecord

KIND = "llama-cpp"
SPEC_TYPES = (
    "draft-simple",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
    "draft-eagle3",
)
ALIASES = {"draft": "draft-simple", "eagle3": "draft-eagle3"}
DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3")
"""The kinds that take a draft GGUF (-md)."""
CONTEXT = 8192


def spec_type(options: dict[str, str]) -> str | None:
    """The --spec-type of these method options (None: plain decoding); refuses unknown options."""
    unknown = set(options) - {"spec", "n_max", "n_min", "eagle_head"}
    if unknown:
        raise ConfigError(f"{KIND}: unknown options {', '.join(sorted(unknown))}")
    kind = options.get("spec")
    if kind is None:
        if set(options) & {"n_max", "n_min", "eagle_head"}:
            raise ConfigError(f"{KIND}: n_max/n_min/eagle_head need spec=...")
        return None
    kind = ALIASES.get(kind, kind)
    if kind not in SPEC_TYPES:
        raise ConfigError(f"{KIND}: spec must be draft, eagle3 or one of {', '.join(SPEC_TYPES)}")
    if "eagle_head" in options and kind != "draft-eagle3":
        raise ConfigError(f"{KIND}: eagle_head needs spec=eagle3")
    for key in ("n_max", "n_min"):
        if key in options and not options[key].isdigit():
            raise ConfigError(f"{KIND}: {key} must be a non-negative integer")
    return kind


def needs_draft(options: dict[str, str]) -> bool:
    return spec_type(options) == "draft-simple"


def skip_line(text: str) -> str | None:
    """The one line printed instead of running `text` when llama-server is not built."""
    if find_binary() is not None:
        return None
    return f"skipping {text}: no llama-server in {binary_dir()}; build it with `{BUILD_HINT}`"


def gguf_path(model_name: str) -> Path:
    """The GGUF a loaded model came from: a .gguf path, or an offline model's assembled file."""
    from specpilot.files import cache_root
    from specpilot.models.offline import OFFLINE_MODELS

    if model_name in OFFLINE_MODELS:
        path = cache_root() / "gguf" / f"{model_name}.gguf"
    elif model_name.lower().endswith(".gguf"):
        path = Path(model_name).expanduser()
    else:
        raise ConfigError(f"{KIND} needs a GGUF model (a .gguf file or an offline name)")
    if not path.is_file():
        raise ConfigError(f"{KIND}: {path} is missing (the peer reads the GGUF as stored)")
    return path


def server_args(
    target: Path, threads: int, options: dict[str, str], draft: Path | None = None
) -> list[str]:
    """llama-server's flags: one slot, no host prompt cache, our thread count, the spec mode."""
    threads_flags = ["-t", str(threads), "-tb", str(threads)]
    args = ["-m", str(target), *threads_flags, "-c", str(CONTEXT), "-np", "1", "--cache-ram", "0"]
    kind = spec_type(options)
    if kind is None:
        return args
    args += ["--spec-type", kind]
    if kind in DRAFT_MODEL_TYPES:
        if draft is None:
            raise ConfigError(
                f"{KIND}:spec={kind} needs a draft GGUF (--draft, or the eagle head's)"
            )
        args += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads)]
    for key in ("n_max", "n_min"):
        if key in options:
            args += [f"--spec-draft-{key.replace('_', '-')}", options[key]]
    return args


def draft_counts(timings: dict) -> tuple[int, int]:
    """(drafted, accepted) tokens of one request from llama-server's `timings`: `draft_n` and
    `draft_n_accepted` (tools/server/server-common.cpp, `server_slot_stats::to_json`), which it
    leaves out when nothing was drafted."""
    return int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))


def _spread(total: int, parts: int) -> list[int]:
    if parts == 0:
        return []
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def turn_stats(tokens: int, prompt_tokens: int, timings: dict) -> GenerationStats:
    """A speculative turn's stats from llama-server's totals (it reports no per-step record).

    Exact: drafted, verified (= drafted: llama.cpp verifies its chain whole) and accepted tokens,
    so the row's acceptance rate; and the steps, one target forward per emitted token that is
    not an accepted draft token (the prompt forward's first token, then each verify step's own),
    so the row's MAT (for a target whose cache drops rejected drafts; one that restores a
    checkpoint instead forwards again). Not measured: how the drafts split over the steps (here
    evenly over the verify steps, so the row's acceptance by position, accepted histogram and
    draft lengths are not llama.cpp's), and draft/verify seconds (0: the server times prompt
    and generation only; prefill_s and total_s are those)."""
    drafted, accepted = draft_counts(timings)
    steps = max(tokens - accepted, 1)
    verifying = max(steps - 1, 1) if drafted else 0  # the prompt forward drafts nothing
    draft_rows = [0] * (steps - verifying) + _spread(drafted, verifying)
    accept_rows = [0] * (steps - verifying) + _spread(accepted, verifying)
    emitted = [a + 1 for a in accept_rows]
    emitted[-1] += tokens - sum(emitted)  # 0 unless an end-of-generation token cut the drafts
    stats = GenerationStats(
        prefill_s=float(timings.get("prompt_ms", 0.0)) / 1000,
        prefill_tokens=int(timings.get("prompt_n", prompt_tokens)),
        total_s=(float(timings.get("prompt_ms", 0.0)) + float(timings.get("predicted_ms", 0.0)))
        / 1000,
    )
    context = prompt_tokens
    for d, a, e in zip(draft_rows, accept_rows, emitted, strict=True):
        stats.add(StepRecord(d, d, a, e, 0.0, 0.0, context, d))
        context += e
    return stats


class LlamaCppMethod:
    """Answers conversations turn by turn through one llama-server started for the bench run."""

    def __init__(self, spec, models):
        binary = find_binary()
        if binary is None:
            raise ConfigError(skip_line(spec.text))
        target = gguf_path(models.target.name)
        draft = None
        if needs_draft(spec.options):
            draft = gguf_path(models.draft.name)
        elif spec_type(spec.options) == "draft-eagle3":
            from specpilot.bench.llama_cpp_eagle3 import draft_gguf
            from specpilot.models.ggml.files import metadata_folder

            folder = metadata_folder(target, models.target.name)
            draft = draft_gguf(spec.options.get("eagle_head"), models.target.name, folder)
        self.tokenizer = models.target.tokenizer
        self.speculative = spec_type(spec.options) is not None
        args = server_args(target, torch.get_num_threads(), spec.options, draft)
        self.server = LlamaServer(binary, args)
        atexit.register(self.server.close)

    def run(self, conversations, config: GenerationConfig):
        from specpilot.bench.methods import TurnRun

        if len(conversations) != 1:
            raise ConfigError(f"{KIND} runs batches of one: use --batch-size 1 or drop it")
        (turns,) = conversations
        messages, runs = [], []
        for turn in turns:
            messages.append({"role": "user", "content": turn})
            ids = encode_prompt(self.tokenizer, messages)
            body = completion_request(
                ids, config.max_new_tokens, config.sampling, config.seed, config.stop_on_eos
            )
            done = self.server.complete(body)
            text = self.tokenizer.decode(done.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": text})
            stats = None
            if self.speculative:
                stats = turn_stats(len(done.token_ids), len(ids), done.timings)
            runs.append(TurnRun(done.token_ids, done.seconds, stats))
        return [runs]
