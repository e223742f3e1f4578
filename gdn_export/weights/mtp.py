"""The multi-token-prediction head of a checkpoint (`mtp.*`, gdn_export.models.mtp).

`load_mtp(directory, model)` reads the head beside a model that `load_checkpoint` built from the same
folder (which leaves `mtp.*` to this module): names and shapes planned from the headers first,
errors naming the key, then the data in the model's dtype on its device. Keys are `mtp.<module
name>` (Qwen3.5 / Qwen3.5-MoE / Qwen3-Next, text and vision-language layouts; a `model.mtp.` prefix
is read too); the MoE families' routed experts load per expert (as published) or stacked, as the
model's do (gdn_export.weights.mapping.stack_experts). The head's tensors must be stored as floats:
a quantized checkpoint keeps its head in 16 bits (as `gdn-export quantize` writes it).

`checkpoint_tensors(head)` names a head's tensors as a checkpoint stores them (make-tiny).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Iterator

import torch

from gdn_export.errors import CheckpointError
from gdn_export.models.mtp import MTP_FAMILIES, MtpHead, MtpModel
from gdn_export.weights.dtypes import check_tensor_dtypes
from gdn_export.weights.mapping import MTP, build_plan, stack_experts
from gdn_export.weights.qwen3_next import per_expert
from gdn_export.weights.reader import CheckpointReader, check_readable

log = logging.getLogger("gdn_export.weights")
PREFIX = "mtp."
_MODEL_PREFIX = re.compile(r"^model\.(?=mtp\.)")


def module_name(key: str) -> str:
    """Checkpoint key -> name in {"mtp." + MtpHead's names}: model.mtp.x -> mtp.x."""
    return _MODEL_PREFIX.sub("", key)


def check_has_mtp(config, where: str) -> None:
    """CheckpointError unless the checkpoint's config declares a usable MTP head."""
    if config.family not in MTP_FAMILIES:
        raise CheckpointError(f"{where}: {config.family} checkpoints have no multi-token-prediction head "
                              f"(speculative decoding needs one: {', '.join(MTP_FAMILIES)})")
    if config.mtp_num_hidden_layers == 0:
        raise CheckpointError(f"{where}: config.json declares no multi-token-prediction head "
                              f"(mtp_num_hidden_layers is 0 or absent)")
    if config.mtp_num_hidden_layers != 1:
        raise CheckpointError(f"{where}: mtp_num_hidden_layers = {config.mtp_num_hidden_layers}; only "
                              f"single-layer MTP heads are supported (as published)")
    if config.mtp_use_dedicated_embeddings:
        raise CheckpointError(f"{where}: mtp_use_dedicated_embeddings is true; only MTP heads that share "
                              f"the model's embedding are supported")


def load_mtp(directory: str | Path, model) -> MtpModel:
    """The MTP head of checkpoint `directory` beside `model` (HybridForCausalLM loaded from it), in
    the model's dtype, on its device, sharing its embedding and lm_head; eval mode, no grad."""
    directory = Path(directory)
    check_readable(directory, "checkpoint directory", folder=True)
    config = model.config
    check_has_mtp(config, str(directory))
    dtype, device = model.dtype, model.device
    with torch.device("meta"):
        head = MtpHead(config).to(dtype)
    expected = {PREFIX + name: tuple(t.shape) for name, t in head.state_dict().items()}
    with CheckpointReader(directory) as reader:
        shapes = {key: shape for key, shape in reader.shapes.items() if MTP.search(key)}
        if not shapes:
            raise CheckpointError(f"{directory}: config.json declares an MTP head (mtp_num_hidden_layers "
                                  f"= {config.mtp_num_hidden_layers}) but no mtp.* tensor is stored")
        experts = stack_experts(shapes, expected, module_name, config.num_experts) if config.num_experts else {}
        plan = build_plan(shapes, expected, rename=module_name, ignore=(), assembled=experts)
        if plan.unexpected:
            more = f" (and {len(plan.unexpected) - 1} more)" if len(plan.unexpected) > 1 else ""
            raise CheckpointError(f"{directory}: tensor {plan.unexpected[0]}{more} is not part of a "
                                  f"{config.family} MTP head")
        used = {key for source in plan.sources.values() for key in source.keys}
        check_tensor_dtypes({key: reader.dtypes[key] for key in used}, where=str(directory),
                            hint="; the MTP head must be stored in 16 or 32 bits")
        state = {}
        for name, source in plan.sources.items():
            state[name[len(PREFIX):]] = source.load(reader, reader.get, dtype, device)
    head.load_state_dict(state, strict=True, assign=True)
    head.requires_grad_(False)
    log.info("%s: loaded the MTP head (%d tensors) in %s", directory, len(state), dtype)
    return MtpModel.for_model(model, head).eval()


def checkpoint_tensors(head: MtpHead) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint key, tensor) of every tensor of `head`, routed experts per expert (as published)."""
    for name, tensor in head.state_dict().items():
        yield from per_expert(PREFIX + name, tensor)
