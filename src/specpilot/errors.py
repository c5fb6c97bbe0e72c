"""Exceptions with messages that name the problem and what to do about it.

Every error a user can cause (bad config, unknown model, mismatched tokenizers, prompt too long,
corrupt cache) derives from `SpecpilotError`; the CLI prints its message and exits non-zero
instead of showing a traceback.

Messages speak the Python API's language: they name API arguments (`eagle_head`, `sv_profile`),
never command-line flags, and record those arguments in `options`; the CLI appends the flags that
set them on the command that failed (`cli.error_flags`).
"""

from __future__ import annotations


class SpecpilotError(Exception):
    """Base class of errors caused by the user's input or environment.

    `options`: the API arguments (keyword names, e.g. "sv_profile") the message is about."""

    def __init__(self, message: str, options: tuple[str, ...] = ()):
        super().__init__(message)
        self.options = tuple(options)


class ConfigError(SpecpilotError, ValueError):
    """A configuration value is invalid."""


class ModelLoadError(SpecpilotError):
    """A model could not be found, fetched, converted or loaded."""


class TokenizerMismatchError(SpecpilotError):
    """Target and draft do not share one tokenizer, so draft tokens mean nothing to the target."""


class PromptError(SpecpilotError, ValueError):
    """A prompt is empty, malformed or longer than the model's context."""
