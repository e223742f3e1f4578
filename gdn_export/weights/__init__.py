"""Checkpoint handling, apart from modeling: reading safetensors, per-family name mapping with
shape checks, and a tiny random checkpoint writer for tests."""

from gdn_export.weights.loader import load_checkpoint
from gdn_export.weights.tiny import make_tiny_checkpoint

__all__ = ["load_checkpoint", "make_tiny_checkpoint"]
