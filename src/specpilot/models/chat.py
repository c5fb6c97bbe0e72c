"""Prompt formatting with the model's chat template, and the model's end-of-turn tokens.

A prompt is a string (one user turn) or a list of {"role", "content"} messages (multi-turn).
Models without a chat template get the raw text (plus whatever special tokens the tokenizer adds).
"""

from __future__ import annotations

from pathlib import Path

from specpilot.errors import PromptError

Messages = list[dict[str, str]]


def as_messages(prompt: str | Messages) -> Messages:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return list(prompt)


def encode_prompt(tokenizer, prompt: str | Messages, chat: bool = True) -> list[int]:
    """Token ids of the prompt, ready for generation (the assistant turn opened when chatting)."""
    messages = as_messages(prompt)
    if not messages or not any(m.get("content", "").strip() for m in messages):
        raise PromptError("the prompt is empty: give some text", ("prompt", "prompts_file"))
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if len(messages) > 1:
        raise PromptError("multi-turn prompts need a model with a chat template")
    return list(tokenizer(messages[0]["content"])["input_ids"])


def eos_token_ids(tokenizer, model_path: Path | None = None) -> frozenset[int]:
    """End-of-sequence ids: the tokenizer's EOS plus those in the model's generation_config.json
    (instruct models often end turns with a token other than the tokenizer's EOS)."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    if model_path is not None and (Path(model_path) / "generation_config.json").exists():
        from transformers import GenerationConfig as HFGenerationConfig

        eos = HFGenerationConfig.from_pretrained(model_path).eos_token_id
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return frozenset(ids)
