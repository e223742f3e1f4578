"""`load_checkpoint`: a Hugging Face checkpoint directory -> `HybridForCausalLM`.

Reads config.json (HybridConfig), plans every tensor by name and shape from the safetensors
headers (per-family modules `qwen3_next.py`, `qwen3_5.py` (also Qwen3.5-MoE), `olmo_hybrid.py` map
the names), then reads the data. Every error is a one-line CheckpointError naming the file or the
tensor key.

Memory: each module tensor is built once, in the target dtype, and handed to the model as it is
(`load_state_dict(assign=True)` on a meta-device model): the model holds the only copy. Per-expert
tensors are written one at a time into their layer's preallocated stacked tensor.

Stored dtypes: floats only (gdn_export.weights.dtypes: F32 / F16 / BF16 / F64); an integer or FP8
tensor is refused by name before any data is read.

dtype: every tensor is converted to the requested dtype (default: the checkpoint's torch_dtype),
A_log, dt_bias and norm weights included, which is what transformers does when it loads in that
dtype (these models keep no module in fp32). The decay g and the RMSNorms still compute in fp32.
With tie_word_embeddings, lm_head shares model.embed_tokens.weight (a stored lm_head is ignored).
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path

import torch

from gdn_export.hf_config import read_config
from gdn_export.config import DTYPES, HybridConfig
from gdn_export.errors import CheckpointError
from gdn_export.models.hybrid import HybridForCausalLM
from gdn_export.modules.kv_cache_fp8 import set_kv_scales
from gdn_export.modules.quant_linear import fixed_dtypes
from gdn_export.weights import kv_scales, olmo_hybrid, qwen3_5, qwen3_next, quantized
from gdn_export.weights.mapping import Plan, report
from gdn_export.weights.dtypes import allowed_dtypes, check_tensor_dtypes
from gdn_export.weights.reader import CheckpointReader, check_readable

log = logging.getLogger("gdn_export.weights")
FAMILIES = {"qwen3_next": qwen3_next, "qwen3_5": qwen3_5, "qwen3_5_moe": qwen3_5,
            "olmo_hybrid": olmo_hybrid}
LM_HEAD = "lm_head.weight"
EMBED = "model.embed_tokens.weight"


def _dtype(dtype: torch.dtype | str | None, config: HybridConfig) -> torch.dtype:
    if dtype is None:
        return config.torch_dtype
    if isinstance(dtype, str):
        if dtype.removeprefix("torch.") not in DTYPES:
            raise CheckpointError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        return DTYPES[dtype.removeprefix("torch.")]
    if dtype not in DTYPES.values():
        raise CheckpointError(f"dtype {dtype} is not one of {', '.join(DTYPES)}")
    return dtype


def _plan(directory: Path, reader: CheckpointReader, config: HybridConfig, model) -> Plan:
    """The family's plan for this checkpoint, names, shapes and stored dtypes checked (headers only).
    The quantized Linears a quantization_config names are swapped into the meta-device `model` and
    planned first (weights.quantized checks their tensors and dtypes); every other tensor must be
    stored as a float the model converts."""
    spec = quantized.parse_spec(quantized.read_quant_config(directory / "config.json"),
                                str(directory / "config.json"))
    family = FAMILIES[config.family]
    quant = quantized.prepare(model, config, family, spec, reader)
    kv = kv_scales.plan(model, config, family, spec, reader)  # FP8 K/V cache scales: read after the weights
    quant.consumed.update(k for pair in kv.values() for k in pair)
    expected = quant.expected({name: tuple(t.shape) for name, t in model.state_dict().items()})
    shapes = quant.shapes(reader.shapes)
    if config.tie_word_embeddings:
        # transformers ties over a stored lm_head; do the same, quietly.
        expected.pop(LM_HEAD, None)
        shapes.pop(LM_HEAD, None)
    plan = family.plan(shapes, expected, config)
    quant.finish(plan)
    report(plan, str(directory))
    checked = quant.consumed | set(quant.expert_scales) | set(quant.expert_scales.values()) | {
        key for source in quant.sources.values() for key in source.keys}
    used = {key for source in plan.sources.values() for key in source.keys}
    floats = allowed_dtypes(config)
    check_tensor_dtypes({k: reader.dtypes[k] for k in used - checked}, floats, str(directory))
    return plan


# The initializers torch.nn's layers call in their constructors. On the meta device they run
# torch._refs, whose first call imports torch._dynamo (~1.2 s); a meta tensor has no values to set.
_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
          "xavier_normal_", "constant_", "zeros_", "ones_")


@contextlib.contextmanager
def _no_init():
    """torch.nn.init's in-place initializers as no-ops (for building modules on the meta device)."""
    saved = {name: getattr(torch.nn.init, name) for name in _INITS}
    try:
        for name in _INITS:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def _meta_model(config: HybridConfig, dtype: torch.dtype | None = None, model_class=HybridForCausalLM):
    with torch.device("meta"), _no_init():
        model = model_class(config)
        return model.to(dtype) if dtype is not None else model


def check_checkpoint(directory: str | Path) -> int:
    """What `load_checkpoint` checks before it reads any tensor data (the folder and its files
    readable, config.json, every tensor's name, shape and stored dtype), as a CheckpointError, for
    commands that must fail before their slow part. Returns the number of weight elements."""
    directory = Path(directory)
    logging.disable(logging.WARNING)  # load_checkpoint says its warnings once, later
    try:
        check_readable(directory, "checkpoint directory", folder=True)
        config = read_config(directory / "config.json")
        with CheckpointReader(directory) as reader:
            _plan(directory, reader, config, _meta_model(config))
            return sum(math.prod(shape) for shape in reader.shapes.values())
    finally:
        logging.disable(logging.NOTSET)


def load_checkpoint(
    directory: str | Path,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str = "cpu",
    model_class: type[HybridForCausalLM] = HybridForCausalLM,
) -> HybridForCausalLM:
    """Build the model of `directory` (config.json + safetensors) in eval mode on `device`, as
    `model_class` (a HybridForCausalLM subclass with the same parameters, e.g.
    gdn_export.models.vlm.HybridVLForCausalLM)."""
    directory = Path(directory)
    check_readable(directory, "checkpoint directory", folder=True)
    config = read_config(directory / "config.json")
    dtype = _dtype(dtype, config)
    model = _meta_model(config, dtype, model_class)

    with CheckpointReader(directory) as reader:
        plan = _plan(directory, reader, config, model)
        keep = fixed_dtypes(model)  # fp8 weights and fp32 scales keep their dtype
        state = {}
        cache: dict[str, torch.Tensor] = {}

        def read(key: str) -> torch.Tensor:
            # Slices of one fused tensor are claimed by consecutive names; keep one at a time.
            if key not in cache:
                cache.clear()
                cache[key] = reader.get(key)
            return cache[key]

        for name, source in plan.sources.items():
            state[name] = source.load(reader, read, keep.get(name, dtype), device)
        cache.clear()
        spec = quantized.parse_spec(quantized.read_quant_config(directory / "config.json"))
        fp8_kv = kv_scales.read(reader, kv_scales.plan(model, config, FAMILIES[config.family], spec, reader))
    if config.tie_word_embeddings:
        state[LM_HEAD] = state[EMBED]
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.tie_weights()
    if fp8_kv:
        set_kv_scales(model, fp8_kv)  # the cache in float8_e4m3fn (gdn_export.modules.kv_cache_fp8)
    model.requires_grad_(False)
    log.info("%s: loaded %s with %d tensors in %s", directory, config.model_type, len(state), dtype)
    return model.eval()
