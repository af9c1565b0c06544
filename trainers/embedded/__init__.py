"""Embedded CPU backend: GRPO on a tiny Qwen2 and generated verifiable tasks (docs/readme_embedded.md)."""

from .backend import EmbeddedBackend
from .recipe import EmbeddedRecipe

__all__ = ["EmbeddedBackend", "EmbeddedRecipe"]
