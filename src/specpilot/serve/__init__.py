"""`specpilot serve`: an OpenAI-compatible HTTP server with continuous batching (app: the routes;
protocol: the request bodies; worker: the engine's thread; metrics: Prometheus; text: streaming
text)."""

from specpilot.serve.app import create_app

__all__ = ["create_app"]
