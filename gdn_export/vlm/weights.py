"""Loading the vision tower of a composite Qwen3.5 / Qwen3.5-MoE checkpoint, and its fingerprint.

Checkpoint names are `model.visual.<module name>` (transformers' Qwen3_5Model.visual), or
`visual.<module name>`; the Conv3d patch embedding `patch_embed.proj.weight` [E, C, Tp, P, P] loads
flattened into the Linear [E, C*Tp*P*P]. Every other tensor loads by name with its shape checked; a
missing or mis-shaped tensor is a CheckpointError naming the checkpoint key.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch

from gdn_export.config import COMPOSITE
from gdn_export.errors import CheckpointError, ConfigError
from gdn_export.models.vision import VisionEncoder
from gdn_export.vision_config import VisionConfig, has_vision, parse_vision_config
from gdn_export.weights.mapping import check_shape
from gdn_export.weights.reader import CheckpointReader

log = logging.getLogger("gdn_export.weights")
PREFIXES = ("model.visual.", "visual.")
PATCH_WEIGHT = "patch_embed.proj.weight"
EMBED_KEYS = ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight")


def load_language(directory: str | Path, dtype=None, device="cpu"):
    """The HybridVLForCausalLM of composite checkpoint `directory`."""
    from gdn_export.models.vlm import HybridVLForCausalLM
    from gdn_export.weights import load_checkpoint

    return load_checkpoint(directory, dtype=dtype, device=device, model_class=HybridVLForCausalLM)


def read_config_dict(directory: str | Path) -> dict:
    path = Path(directory) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable JSON config ({exc})") from None


def vision_prefix(shapes: dict) -> str | None:
    """The prefix under which the checkpoint stores its vision tower, or None without one."""
    for prefix in PREFIXES:
        if any(k.startswith(prefix) for k in shapes):
            return prefix
    return None


def is_composite(directory: str | Path) -> bool:
    """Whether `directory`'s config.json is a composite (vision-language) model type; False where it
    cannot be read (the text loader reports that in its own words)."""
    try:
        return read_config_dict(directory).get("model_type") in COMPOSITE
    except CheckpointError:
        return False


def has_vision_tower(directory: str | Path) -> bool:
    """Whether `directory` is a composite checkpoint holding its vision tower (config and tensors).
    An unreadable config.json is False here: the text loader reports it in its own words."""
    try:
        if not has_vision(read_config_dict(directory)):
            return False
    except CheckpointError:
        return False
    with CheckpointReader(directory) as reader:
        return vision_prefix(reader.shapes) is not None


def fingerprint(directory: str | Path) -> str:
    """SHA-256 (hex) of config.json's bytes and of the stored bytes of the patch embedding, the
    merger's last projection and the token embedding: the same for both files of one export,
    different for checkpoints that differ in configuration or in those weights."""
    directory = Path(directory)
    digest = hashlib.sha256((directory / "config.json").read_bytes())
    with CheckpointReader(directory) as reader:
        prefix = vision_prefix(reader.shapes) or PREFIXES[0]
        keys = [prefix + PATCH_WEIGHT, prefix + "merger.linear_fc2.weight"]
        keys += [k for k in EMBED_KEYS if k in reader.shapes][:1]
        for key in keys:
            if key in reader.shapes:
                digest.update(key.encode())
                digest.update(reader.get(key).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def load_vision(directory: str | Path, dtype: torch.dtype | None = None,
                device: torch.device | str = "cpu") -> VisionEncoder:
    """The VisionEncoder of composite checkpoint `directory` in `dtype` (default: the checkpoint's
    dtype, as for the language model) on `device`, in eval mode."""
    directory = Path(directory)
    d = read_config_dict(directory)
    config = parse_vision_config(d)
    if dtype is None:
        from gdn_export.hf_config import parse_config

        dtype = parse_config(d).torch_dtype
    with torch.device("meta"):
        model = VisionEncoder(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    state = {}
    with CheckpointReader(directory) as reader:
        prefix = vision_prefix(reader.shapes)
        if prefix is None:
            raise CheckpointError(f"{directory}: no vision tower tensors (model.visual.*) in the checkpoint")
        for name, want in expected.items():
            key = prefix + name
            if key not in reader.shapes:
                raise CheckpointError(f"tensor {key} is missing from the checkpoint")
            tensor_shape = reader.shapes[key]
            if name == PATCH_WEIGHT:
                conv = (config.hidden_size, config.in_channels, config.temporal_patch_size,
                        config.patch_size, config.patch_size)
                check_shape(key, tensor_shape, conv)
                tensor = reader.get(key).reshape(want)
            else:
                check_shape(key, tensor_shape, want)
                tensor = reader.get(key)
            state[name] = tensor.to(device=device, dtype=dtype).contiguous()
        extra = sorted(k for k in reader.shapes if k.startswith(prefix) and k[len(prefix):] not in expected)
    if extra:
        log.warning("%s: %d vision tensors not used by the model: %s", directory, len(extra), ", ".join(extra[:5]))
    model.load_state_dict(state, strict=True, assign=True)
    model.requires_grad_(False)
    return model.eval()


def vision_config_of(directory: str | Path) -> VisionConfig:
    d = read_config_dict(directory)
    if not has_vision(d):
        raise ConfigError(f"{directory}: not a vision-language checkpoint (model_type "
                          f"{d.get('model_type')!r} without vision_config)")
    return parse_vision_config(d)
