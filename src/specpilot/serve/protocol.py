"""The OpenAI request bodies the server accepts, validated strictly.

A field the engine cannot honour is an error, not silently ignored: `n` > 1, `logprobs`,
`best_of`, `echo`, `suffix`, a `logit_bias`, non-zero penalties, tools and unknown fields get a
400 naming the field (`extra="forbid"`), so a client never gets an answer that differs from what
it asked for. Omitted sampling fields take the server's defaults (`specpilot serve
--temperature/--top-p/--top-k/--max-new-tokens`); an omitted seed draws a fresh one per request.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specpilot.config import GenerationConfig, SamplingConfig

MAX_STOP_STRINGS = 16
MAX_SEED = 2**63 - 1


def _neutral(name: str, value: Any, neutral: tuple) -> Any:
    if value not in neutral:
        raise ValueError(f"`{name}` is not supported by this server; leave it unset")
    return value


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: Annotated[int, Field(gt=0)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    """vLLM's extension: -1 or 0 keeps every token."""
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    logprobs: Any = None
    top_logprobs: Any = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None
    user: str | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value):
        return _neutral("n", value, (None, 1))

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, value, info):
        return _neutral(info.field_name, value, (None, False, 0))

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value, info):
        return _neutral(info.field_name, value, (None, 0, 0.0))

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value):
        return _neutral("logit_bias", value, (None, {}))

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP_STRINGS or not all(stops):
            raise ValueError(f"`stop` takes 1..{MAX_STOP_STRINGS} non-empty strings")
        return stops

    def limit(self) -> int | None:
        return self.max_tokens

    def generation_config(self, defaults: GenerationConfig) -> GenerationConfig:
        """The engine's config for this request; omitted fields take `defaults`."""
        base = defaults.sampling
        sampling = SamplingConfig(
            base.temperature if self.temperature is None else self.temperature,
            base.top_k if self.top_k is None else max(self.top_k, 0),
            base.top_p if self.top_p is None else self.top_p,
        )
        return GenerationConfig(
            self.limit() or defaults.max_new_tokens,
            sampling,
            secrets.randbelow(MAX_SEED) if self.seed is None else self.seed,
            tuple(self.stop or ()),
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str]
    """One prompt: text (fed as it is, no chat template) or token ids."""
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], str):
            if len(value) != 1:
                raise ValueError("this server answers one prompt per request; send them apart")
            value = value[0]
        if not value:
            raise ValueError("the prompt is empty")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value):
        return _neutral("echo", value, (False,))

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value):
        return _neutral("best_of", value, (None, 1))

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value):
        return _neutral("suffix", value, (None, ""))


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_dict(self) -> dict[str, str]:
        """{"role", "content"} for the chat template (developer messages are system ones)."""
        content = self.content
        if not isinstance(content, str):
            content = "".join(part.text for part in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _one_limit(self):
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        return self

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


SamplingFields.model_rebuild()
CompletionRequest.model_rebuild()
ChatCompletionRequest.model_rebuild()


def error_body(message: str, kind: str = "invalid_request_error", param=None, code=None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
