"""Model backends and loading: offline packaged models, runners, tokenizer checks."""

from specpilot.models.loading import LoadedModel, check_same_tokenizer, load_model

__all__ = ["LoadedModel", "check_same_tokenizer", "load_model"]
