"""A loaded target and its optional draft model: what every method is built on."""

from __future__ import annotations

from dataclasses import dataclass

from specpilot.models.loading import LoadedModel


@dataclass
class ModelPair:
    target: LoadedModel
    draft: LoadedModel | None
