"""The MTP head (gdn_export.models.mtp) against an independent reference built from transformers.

transformers 5.24 does not implement the MTP forward of these families (its Qwen3.5 / Qwen3.5-MoE /
Qwen3-Next models drop `mtp.*` on load), so the reference is composed here from the checkpoint's
layout: the head's decoder layer and final norm are a one-layer transformers model of the family
(its own attention, rope, MoE, RMSNorm and causal mask) loaded with mtp.layers.0.* and mtp.norm,
the main model's embedding and lm_head; its inputs_embeds are fc([norm(embed(x_{p+1})); norm(h_p)])
with h_p the transformers model's last_hidden_state (after its final norm). Ours runs the prompt in
two ragged calls against it (fp32, 1e-4).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from gdn_export.layout import DeployLayout
from gdn_export.weights import load_checkpoint
from gdn_export.weights.mtp import load_mtp
from tests.mtp_checkpoints import MTP_FAMILIES, mtp_checkpoint

transformers = pytest.importorskip("transformers")

CLASSES = {"qwen3_5": "Qwen3_5ForCausalLM", "qwen3_next": "Qwen3NextForCausalLM",
           "qwen3_5_moe": "Qwen3_5MoeForCausalLM"}
CONFIGS = {"qwen3_5": "Qwen3_5TextConfig", "qwen3_next": "Qwen3NextConfig",
           "qwen3_5_moe": "Qwen3_5MoeTextConfig"}


def _stacked(tensors: dict, prefix: str, experts: int) -> dict:
    """transformers 5's stacked experts from the published per-expert tensors under `prefix`."""
    gate_up = [torch.cat((tensors[f"{prefix}.{e}.gate_proj.weight"], tensors[f"{prefix}.{e}.up_proj.weight"]))
               for e in range(experts)]
    down = [tensors[f"{prefix}.{e}.down_proj.weight"] for e in range(experts)]
    return {f"{prefix}.gate_up_proj": torch.stack(gate_up), f"{prefix}.down_proj": torch.stack(down)}


def _reference(path, family: str, ids: torch.Tensor) -> torch.Tensor:
    """The MTP logits [B, T-1, V] at positions 0..T-2 of ids [B, T] (x_{p+1} = ids[:, p + 1])."""
    cls = getattr(transformers, CLASSES[family])
    main = cls.from_pretrained(path, dtype=torch.float32).eval()
    raw = json.loads((path / "config.json").read_text())
    raw.update(num_hidden_layers=1, layer_types=["full_attention"], mlp_only_layers=[])
    head = cls(getattr(transformers, CONFIGS[family])(**{k: v for k, v in raw.items() if k != "architectures"}))
    tensors = load_file(str(path / "model.safetensors"))
    state = {"model.embed_tokens.weight": main.model.embed_tokens.weight, "lm_head.weight": main.lm_head.weight,
             "model.norm.weight": tensors["mtp.norm.weight"]}
    layer = {k.removeprefix("mtp.layers.0."): v for k, v in tensors.items() if k.startswith("mtp.layers.0.")}
    if raw.get("num_experts"):
        per_expert = {k: v for k, v in layer.items() if ".experts." in k}
        layer = {k: v for k, v in layer.items() if ".experts." not in k}
        layer.update(_stacked(per_expert, "mlp.experts", raw["num_experts"]))
    state.update({f"model.layers.0.{k}": v for k, v in layer.items()})
    missing, unexpected = head.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    norm_cls, H = type(main.model.norm), raw["hidden_size"]
    norm_e, norm_h = norm_cls(H, eps=raw["rms_norm_eps"]), norm_cls(H, eps=raw["rms_norm_eps"])
    norm_e.weight.data.copy_(tensors["mtp.pre_fc_norm_embedding.weight"])
    norm_h.weight.data.copy_(tensors["mtp.pre_fc_norm_hidden.weight"])
    with torch.no_grad():
        hidden = main.model(input_ids=ids).last_hidden_state[:, :-1]
        e = norm_e(main.model.embed_tokens(ids[:, 1:]))
        x = torch.cat((e, norm_h(hidden)), -1) @ tensors["mtp.fc.weight"].T
        return head(inputs_embeds=x).logits


@pytest.mark.parametrize("family", MTP_FAMILIES)
def test_mtp_head_matches_transformers_composition(family, tmp_path_factory):
    path = mtp_checkpoint(family, tmp_path_factory.getbasetemp())
    T = 11
    ids = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(1))
    want = _reference(path, family, ids)

    model = load_checkpoint(path)
    model.layout = DeployLayout.make(cache_len=32, logits="all")
    mtp = load_mtp(path, model)
    assert mtp.lm_head is model.lm_head and mtp.embed_tokens is model.model.embed_tokens
    # the main model's normed hidden states, then the head over (h_p, x_{p+1}) in two calls of
    # different lengths per row (the cache carries the context between them)
    with torch.no_grad():
        hidden, *_ = model.hidden_states(ids, torch.zeros(2, dtype=torch.long), torch.full((2,), T),
                                         *model.empty_states(2))
        key, value = mtp.empty_states(2)
        got = torch.zeros_like(want)
        cut = torch.tensor([4, 7])
        logits, y, key, value = mtp(ids[:, 1:8], hidden[:, :7], torch.zeros(2, dtype=torch.long), cut, key, value)
        for b in range(2):
            got[b, :cut[b]] = logits[b, :cut[b]]
        rest = [ids[b, 1 + cut[b]:] for b in range(2)]
        n = max(len(r) for r in rest)
        tok = torch.zeros(2, n, dtype=torch.long)
        hid = torch.zeros(2, n, hidden.shape[-1])
        for b in range(2):
            tok[b, :len(rest[b])] = rest[b]
            hid[b, :len(rest[b])] = hidden[b, cut[b]:T - 1]
        logits, y, key, value = mtp(tok, hid, cut, torch.tensor([len(r) for r in rest]), key, value)
        for b in range(2):
            got[b, cut[b]:] = logits[b, :len(rest[b])]
    assert y.shape == (2, n, 64)
    err = (got - want).abs().max().item()
    assert err < 1e-4, err
    assert want.std() > 0.1  # logits of order 1, not a vanishing signal
