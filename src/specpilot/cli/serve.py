"""`specpilot serve`: an OpenAI-compatible HTTP server with continuous batching (specpilot.serve).

The decoding flags are generate's; --temperature, --top-p, --top-k and --max-new-tokens are the
defaults for requests that leave those fields out. `--backend` is generate's model backend
(auto, ggml, torch, hf) under specpilot's engine, or `hf-generate`: the same API through
transformers' own `generate`, one request at a time (with --draft: assisted generation), the
baseline a user would otherwise script, for `bench-serve` to compare against. `--api-key`
(or SPECPILOT_API_KEY; the flag wins) makes every /v1 route require `Authorization: Bearer KEY`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from specpilot.cli.common import (
    add_method_arguments,
    add_model_arguments,
    batch_size,
    engine_builder,
    generation_config,
    load_from_args,
)
from specpilot.config import require
from specpilot.methods.defaults import DEFAULT_DRAFT
from specpilot.models.loading import BACKENDS
from specpilot.serve.auth import API_KEY_ENV, resolve_api_key

MAX_NEW_TOKENS_HELP = "max_tokens of requests that give none (default %(default)s)"


def register(commands) -> None:
    parser = commands.add_parser(
        "serve", help="serve an OpenAI-compatible API (continuous batching, SSE streaming)"
    )
    add_model_arguments(parser, 512, MAX_NEW_TOKENS_HELP)
    parser.set_defaults(draft=None)  # hf-generate drafts only when --draft is given
    parser.add_argument(
        "--backend",
        dest="model_backend",
        choices=(*BACKENDS, "hf-generate"),
        default="auto",
        help="auto, ggml, torch, hf: where specpilot's engine runs the models, as for generate "
        "(continuous batching; default auto); hf-generate: transformers' generate, one request "
        "at a time, the baseline a user would script (with --draft: its assisted generation; "
        "takes none of the method flags)",
    )
    add_specpilot_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--max-queue",
        type=int,
        default=256,
        help="requests waiting for a slot before new ones get 503 (default %(default)s)",
    )
    parser.add_argument("--model-name", help="the `model` clients ask for (default: --target)")
    parser.add_argument(
        "--api-key",
        help="require 'Authorization: Bearer API_KEY' on every /v1 route; /health and /metrics "
        f"stay open (default: ${API_KEY_ENV} if set, else no key)",
    )
    parser.set_defaults(run=run)


def add_specpilot_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the specpilot backend: the method and the batch."""
    add_method_arguments(parser)
    parser.add_argument(
        "--max-batch",
        type=int,
        default=8,
        help="requests decoded together: the KV cache holds one slot each (default %(default)s)",
    )
    parser.add_argument(
        "--prefill-chunk",
        type=int,
        metavar="TOKENS",
        help="prefill at most TOKENS prompt tokens per step, so requests being decoded keep "
        "emitting while a burst of prompts is read (default: every admitted prompt at once)",
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from specpilot.serve import create_app
    from specpilot.serve.worker import EngineWorker

    defaults = generation_config(args)
    api_key = resolve_api_key(args.api_key)
    require(args.max_queue >= 0, f"--max-queue must be >= 0, got {args.max_queue}")
    require(0 <= args.port <= 65535, f"--port must be in 0..65535, got {args.port}")
    method = ""  # the engine's drafter and policy, resolved
    if args.model_backend == "hf-generate":
        backend = hf_generate_worker(args)
    else:
        args.draft = args.draft or DEFAULT_DRAFT
        size = batch_size(args.max_batch)
        require(
            args.prefill_chunk is None or args.prefill_chunk >= 1,
            f"--prefill-chunk must be >= 1 token, got {args.prefill_chunk}",
        )
        draft, build = engine_builder(args)
        engine = build(load_from_args(args, draft, size))
        backend, method = EngineWorker(engine, args.prefill_chunk), f" ({engine.method})"
    name = args.model_name or args.target
    app = create_app(backend, name, defaults, args.max_queue, api_key=api_key)
    guarded = " (API key required)" if api_key else ""
    where = f"http://{args.host}:{args.port}/v1"
    print(f"serving {name!r}{method} on {where}{guarded}", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info"))
    worker = app.state.worker

    def serve_http() -> None:
        try:
            server.run()
        finally:  # also when it cannot start (port taken): the main thread must not wait on
            worker.stop()

    http = threading.Thread(target=serve_http, name="specpilot-http")
    worker.own_thread = False  # decode on the main thread (serve.worker.Worker says why)
    signal.signal(signal.SIGTERM, _interrupt)
    http.start()
    try:
        worker.drive()
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        worker.stop()
        http.join()
    if not server.started:
        where = f"{args.host}:{args.port}"
        print(f"error: could not serve on {where} (see the log above)", file=sys.stderr)
        return 2
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def hf_generate_worker(args: argparse.Namespace):
    """The baseline backend; flags it cannot honour are an error, not silently ignored."""
    from specpilot.serve.hf_worker import HFGenerateWorker

    probe = argparse.ArgumentParser()
    add_specpilot_arguments(probe)
    given = [
        "--" + name.replace("_", "-")
        for name, default in vars(probe.parse_args([])).items()
        if getattr(args, name) != default
    ]
    require(
        not given,
        "--backend hf-generate decodes one request at a time with transformers' generate "
        f"(--draft: its assisted generation); drop {', '.join(given)}, which set the method and "
        "batch of specpilot's engine (--backend auto, ggml, torch or hf)",
    )
    models = load_from_args(args, args.draft, backend="hf")
    return HFGenerateWorker(models.target, models.draft)
