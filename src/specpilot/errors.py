"""Exceptions with messages that name the problem and what to do about it.

Every error a user can cause (bad config, unknown model, mismatched tokenizers, prompt too long,
corrupt cache) derives from `SpecpilotError`; the CLI prints its message and exits non-zero
instead of showing a traceback.
"""


class SpecpilotError(Exception):
    """Base class of errors caused by the user's input or environment."""


class ConfigError(SpecpilotError, ValueError):
    """A configuration value is invalid."""


class ModelLoadError(SpecpilotError):
    """A model could not be found, fetched, converted or loaded."""


class TokenizerMismatchError(SpecpilotError):
    """Target and draft do not share one tokenizer, so draft tokens mean nothing to the target."""


class PromptError(SpecpilotError, ValueError):
    """A prompt is empty, malformed or longer than the model's context."""
