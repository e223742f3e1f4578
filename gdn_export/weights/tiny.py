"""`make_tiny_checkpoint`: a small random checkpoint in the Hugging Face layout, for tests.

No transformers needed: the config dict is written the way transformers 5 writes it, the tensors
come from our own model under the family's checkpoint names. Defaults: hidden 64, 4 layers (3 GDN +
1 attention, full_attention_interval 4), GDN Hk=2, Hv=4, Dk=16, Dv=24, conv kernel 4, 4 attention
heads / 2 KV heads of 16 with partial_rotary_factor 0.25, vocab 256; qwen3_next and qwen3_5_moe add
a MoE of 4 experts (top 2) with a shared expert in every layer (written per expert, as published);
olmo_hybrid has the same sizes with full rope, beta in (0, 2) and its published tensor names.

The random init is conditioned so that activations and logits are neither vanishing nor
saturated: linears N(0, 0.02), lm_head N(0, hidden^-0.5) (logits of order 1), zero-centred norms
N(0, 0.1) (plain norms 1 + N(0, 0.1)), gated norm 1 + N(0, 0.1), conv N(0, 0.3), A = exp(A_log) ~ U(1, 16) and dt_bias the
inverse softplus of dt ~ logU(1e-3, 1e-1), so the per-token decay exp(g) spans long and short
memories.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from gdn_export.hf_config import parse_config
from gdn_export.config import HybridConfig
from gdn_export.paths import make_dir_mode_usual, publish_dir, publish_files, usual_modes, writes_in_place
from gdn_export.errors import CheckpointError, InputError
from gdn_export.models.hybrid import HybridForCausalLM
from gdn_export.models.mtp import MTP_FAMILIES, MtpHead
from gdn_export.weights import mtp as mtp_weights
from gdn_export.weights import olmo_hybrid, qwen3_5, qwen3_next
from gdn_export.weights.reader import INDEX_FILE, SINGLE_FILE

_ARCH = {
    "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "olmo_hybrid": "OlmoHybridForCausalLM",
}
# family -> (default model type, composite model type or None)
_MODEL_TYPES = {
    "qwen3_next": ("qwen3_next", None),
    "qwen3_5": ("qwen3_5_text", "qwen3_5"),
    "qwen3_5_moe": ("qwen3_5_moe_text", "qwen3_5_moe"),
    "olmo_hybrid": ("olmo_hybrid", None),
}
FAMILIES = tuple(_MODEL_TYPES)


def _olmo_text(overrides: dict) -> dict:
    # No head_dim (hidden / heads = 16) and no Qwen fields; pad/eos ids inside the tiny vocab.
    text = {
        "model_type": "olmo_hybrid", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "attention_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
        "linear_value_head_dim": 24, "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
        "max_position_embeddings": 4096, "pad_token_id": None, "eos_token_id": None, "dtype": "float32",
    }
    text.update(overrides)
    return {"architectures": [_ARCH["olmo_hybrid"]], **text}


def tiny_config_dict(family: str = "qwen3_5", model_type: str | None = None, **overrides: Any) -> dict:
    """The config.json dict of a tiny model; `overrides` replace text-model fields."""
    if family not in _MODEL_TYPES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    model_type = model_type or _MODEL_TYPES[family][0]
    if model_type not in _MODEL_TYPES[family]:
        raise ValueError(f"model_type {model_type!r} does not belong to family {family!r}")
    if family == "olmo_hybrid":
        return _olmo_text(overrides)
    composite = model_type == _MODEL_TYPES[family][1]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    if family in ("qwen3_5", "qwen3_5_moe"):
        rope.update(mrope_section=[1, 1, 0], mrope_interleaved=True)
    text = {
        "model_type": f"{model_type}_text" if composite else model_type,
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "full_attention_interval": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "attn_output_gate": True, "attention_bias": False, "rope_parameters": rope,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
        "linear_value_head_dim": 24, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "tie_word_embeddings": False, "max_position_embeddings": 4096,
        "dtype": "float32",
    }
    if family in ("qwen3_next", "qwen3_5_moe"):
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    shared_expert_intermediate_size=48)
    if family == "qwen3_next":
        text.update(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    if family == "qwen3_5_moe":
        del text["intermediate_size"]  # every layer is MoE; transformers has no such field
    text.update(overrides)
    if not composite:
        return {"architectures": [_ARCH[model_type]], **text}
    return {
        "architectures": [_ARCH[model_type]],
        "model_type": model_type,
        "text_config": text,
        "vision_config": {"model_type": f"{model_type}_vision", "depth": 1, "hidden_size": 32,
                          "num_heads": 2, "out_hidden_size": text["hidden_size"]},
        "tie_word_embeddings": text["tie_word_embeddings"],
        "dtype": text["dtype"],
    }


@torch.no_grad()
def init_tiny_weights(model: HybridForCausalLM, seed: int = 0) -> None:
    """Seeded, well-conditioned random init of every parameter (see module docstring)."""
    _init(model.named_parameters(), model.config, torch.Generator().manual_seed(seed))


@torch.no_grad()
def init_tiny_mtp(head: MtpHead, config: HybridConfig, seed: int = 0) -> None:
    """The same init for an MTP head (its own generator: the model's weights do not depend on it)."""
    _init(head.named_parameters(), config, torch.Generator().manual_seed(seed + _MTP_SEED))


_MTP_SEED = 1_000_003


def _init(named_parameters, config: HybridConfig, gen: torch.Generator) -> None:
    hidden = config.hidden_size

    def normal(p, mean, std):
        p.copy_(torch.randn(p.shape, generator=gen) * std + mean)

    for name, p in named_parameters:
        leaf = name.rsplit(".", 2)[-2:]
        if name == "lm_head.weight" or (config.tie_word_embeddings and name.endswith("embed_tokens.weight")):
            normal(p, 0.0, hidden**-0.5)
        elif name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(1.0, 16.0, generator=gen).log())
        elif name.endswith("dt_bias"):
            dt = torch.empty(p.shape).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
            p.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        elif name.endswith("linear_attn.norm.weight") or name.endswith("linear_attn.o_norm.weight"):
            normal(p, 1.0, 0.1)
        elif leaf[-1] == "weight" and "norm" in leaf[0]:
            # zero-centred: the scale is 1 + w; plain: the scale is w
            normal(p, 0.0 if config.zero_centered_norm else 1.0, 0.1)
        elif name.endswith("conv1d.weight"):
            normal(p, 0.0, 0.3)
        elif name.endswith("mlp.gate.weight"):
            normal(p, 0.0, 0.1)  # router: spread the expert probabilities
        else:
            normal(p, 0.0, 0.02)


def _shard(names: list[str], tensors: dict[str, torch.Tensor], shards: int) -> list[list[str]]:
    """Exactly `shards` non-empty groups of consecutive names, of roughly equal bytes
    (needs len(names) >= shards)."""
    nbytes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    budget, groups, size = sum(nbytes) / shards, [[]], 0
    for i, (name, n) in enumerate(zip(names, nbytes)):
        to_open = shards - len(groups)
        # Open the next shard when this one has its share, or when every name left must start
        # one of the shards still to open (no shard may be empty).
        if groups[-1] and to_open and (size >= budget * len(groups) or len(names) - i <= to_open):
            groups.append([])
        groups[-1].append(name)
        size += n
    return groups


def check_target(directory: str | Path, overwrite: bool = False) -> Path:
    """CheckpointError unless a checkpoint may be written to `directory`: it does not exist, is an
    empty folder, or (with overwrite) holds a checkpoint (a config.json), and no folder on the way
    to it is a file. Replacing is limited to checkpoints so that a mistyped path never deletes an
    unrelated folder."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"{directory}: exists and is not a folder")
    if directory.is_dir() and any(directory.iterdir()):
        if not overwrite:
            raise CheckpointError(f"{directory}: exists and is not empty (pass overwrite=True to replace it)")
        if not (directory / "config.json").is_file():
            raise CheckpointError(f"{directory}: holds no config.json, so it is not a checkpoint to replace")
    parent = directory.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise CheckpointError(f"{directory}: {parent} is a file, not a folder")
    return directory


def make_tiny_checkpoint(
    directory: str | Path,
    family: str = "qwen3_5",
    seed: int = 0,
    *,
    shards: int = 1,
    model_type: str | None = None,
    mtp_layers: int = 0,
    extra_tensors: dict[str, torch.Tensor] | None = None,
    overwrite: bool = False,
    **overrides: Any,
) -> Path:
    """Write a random checkpoint (config.json + safetensors) to `directory` and return its path.

    family: "qwen3_5" (default model_type qwen3_5_text; "qwen3_5" writes the composite layout with
    model.language_model. names), "qwen3_5_moe" (likewise: qwen3_5_moe_text or qwen3_5_moe),
    "qwen3_next" or "olmo_hybrid". mtp_layers > 0 adds a multi-token-prediction head of that many
    layers (`mtp.*` tensors, config field mtp_num_hidden_layers, as the released Qwen3.5 and
    Qwen3-Next checkpoints; gdn_export.models.mtp). shards > 1 writes exactly that many
    model-0000i-of-0000N files with model.safetensors.index.json (at most one per tensor).
    extra_tensors are written as they are (e.g. vision/mtp tensors). overrides replace config
    fields (e.g. num_hidden_layers=6, tie_word_embeddings=True, dtype="bfloat16"). overwrite
    replaces a folder that holds a checkpoint (see `check_target`). The directory appears
    complete or not at all.
    """
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise InputError(f"shards must be an integer >= 1, got {shards!r}")
    if isinstance(mtp_layers, bool) or not isinstance(mtp_layers, int) or mtp_layers < 0:
        raise InputError(f"mtp_layers must be an integer >= 0, got {mtp_layers!r}")
    if mtp_layers and family not in MTP_FAMILIES:
        raise InputError(f"{family} has no multi-token-prediction head (families with one: "
                         f"{', '.join(MTP_FAMILIES)})")
    directory = check_target(Path(os.path.abspath(directory)), overwrite)  # "." has no name of its own
    if mtp_layers:
        overrides = {"mtp_num_hidden_layers": mtp_layers, "mtp_use_dedicated_embeddings": False, **overrides}
    cfg_dict = tiny_config_dict(family, model_type, **overrides)
    config = parse_config(cfg_dict)
    model = HybridForCausalLM(config)
    init_tiny_weights(model, seed)
    model.to(config.torch_dtype)

    naming = {"qwen3_next": qwen3_next, "olmo_hybrid": olmo_hybrid}.get(config.family, qwen3_5)
    tensors = {}
    for name, t in model.state_dict().items():
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue
        for key, part in naming.checkpoint_tensors(name, t, config):
            tensors[key] = part.detach().clone().contiguous()
    if config.mtp_num_hidden_layers:
        head = MtpHead(config)
        init_tiny_mtp(head, config, seed)
        for key, part in mtp_weights.checkpoint_tensors(head.to(config.torch_dtype)):
            tensors[key] = part.detach().clone().contiguous()
    for name, t in (extra_tensors or {}).items():
        tensors[name] = t.detach().clone().contiguous()
    if shards > len(tensors):
        raise InputError(f"{shards} shards asked for, but this checkpoint has only {len(tensors)} "
                         f"tensors (each shard holds at least one)")

    in_place = writes_in_place(directory)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory if in_place else directory.parent))
        make_dir_mode_usual(tmp)  # mkdtemp makes it 0700
    except OSError as exc:
        raise CheckpointError(f"{directory}: cannot create it ({exc.strerror})") from None
    written = False
    try:
        (tmp / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n", encoding="utf-8")
        names = sorted(tensors)
        if shards == 1:
            save_file(tensors, str(tmp / SINGLE_FILE), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, group in enumerate(_shard(names, tensors, shards), 1):
                file = f"model-{i:05d}-of-{shards:05d}.safetensors"
                save_file({n: tensors[n] for n in group}, str(tmp / file), metadata={"format": "pt"})
                weight_map.update({n: file for n in group})
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        usual_modes(tmp)  # safetensors writes 0600
        written = True
    finally:
        if not written:
            shutil.rmtree(tmp, ignore_errors=True)
    if in_place:
        _fill_in_place(tmp, directory, overwrite)
    else:  # a checkpoint that appeared meanwhile is kept unless overwrite
        publish_dir(tmp, directory, str(directory), overwrite=overwrite)
    return directory


def _fill_in_place(tmp: Path, directory: Path, overwrite: bool) -> None:
    """Replace directory's contents (empty, or a checkpoint with overwrite: check_target) by the
    files of tmp, a folder inside it: with overwrite the old entries go first; then each new file is
    moved in (config.json last, so that an interrupted fill never looks like a checkpoint), and
    without overwrite none replaces a file that appeared meanwhile (gdn_export.paths.publish_files)."""
    try:
        if overwrite:
            for entry in directory.iterdir():
                if entry == tmp:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        files = sorted(tmp.iterdir(), key=lambda f: f.name == "config.json")
        publish_files([(f, directory / f.name) for f in files], overwrite=overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
