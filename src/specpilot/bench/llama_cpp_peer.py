"""The `llama-cpp` bench peer: llama.cpp's own native decoding of the same GGUF, same prompt ids,
same thread count, greedy or the same sampling settings.

- `llama-cpp`: plain decoding (llama-server, no speculation);
- `llama-cpp:spec=KIND[,n_max=N,n_min=N]`: its speculative modes, KIND one of `SPEC_TYPES`
  (`draft` is `draft-simple` with the bench's draft GGUF).

The binaries come from scripts/build_llama_cpp.sh; without them the method is skipped with one line.
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
from specpilot.errors import ConfigError
from specpilot.models.chat import encode_prompt

KIND = "llama-cpp"
SPEC_TYPES = (
    "draft-simple",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
)
CONTEXT = 8192


def spec_type(options: dict[str, str]) -> str | None:
    """The --spec-type of these method options (None: plain decoding); refuses unknown options."""
    unknown = set(options) - {"spec", "n_max", "n_min"}
    if unknown:
        raise ConfigError(f"{KIND}: unknown options {', '.join(sorted(unknown))}")
    kind = options.get("spec")
    if kind is None:
        if set(options) & {"n_max", "n_min"}:
            raise ConfigError(f"{KIND}: n_max/n_min need spec=...")
        return None
    kind = "draft-simple" if kind == "draft" else kind
    if kind not in SPEC_TYPES:
        raise ConfigError(f"{KIND}: spec must be draft or one of {', '.join(SPEC_TYPES)}")
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
    from specpilot.models.offline import OFFLINE_MODELS, cache_root

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
    if kind == "draft-simple":
        if draft is None:
            raise ConfigError(f"{KIND}:spec=draft needs a --draft model")
        args += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads)]
    for key in ("n_max", "n_min"):
        if key in options:
            args += [f"--spec-draft-{key.replace('_', '-')}", options[key]]
    return args


class LlamaCppMethod:
    """Answers conversations turn by turn through one llama-server started for the bench run."""

    def __init__(self, spec, models):
        binary = find_binary()
        if binary is None:
            raise ConfigError(skip_line(spec.text))
        draft = gguf_path(models.draft.name) if needs_draft(spec.options) else None
        self.tokenizer = models.target.tokenizer
        args = server_args(
            gguf_path(models.target.name), torch.get_num_threads(), spec.options, draft
        )
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
            runs.append(TurnRun(done.token_ids, done.seconds))
        return [runs]
