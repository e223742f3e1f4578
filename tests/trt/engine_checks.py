"""`check_deployment_engine`: what every deployment-shaped engine must show, for any engine built by
`build_engine` (the hand-made graphs here, whole exported models): the layer kinds of the in-place
K/V cache, fused attention and gdn plugins, and state outputs that share their input's memory."""

from __future__ import annotations

import json
from collections import Counter

from gdn_export.trt import inspect_engine, state_aliasing
from gdn_export.trt.build import layers_path
from gdn_export.trt.inspect import KV_CACHE, PLUGIN


def check_deployment_engine(engine, plugins, *, kv_layers: int, attention_layers: int, plugin_layers: int) -> dict:
    """Assert the network's layer kinds (KV_CACHE_UPDATE per K and V cache, ATTENTION_INPUT /
    ATTENTION_OUTPUT per attention, PLUGIN_V3 per gdn node), that every present.key / .value is
    updated in place by the KV cache update and every gdn state by its plugin (no copy inserted),
    and that both profiles are in the record. Returns the build record."""
    info = inspect_engine(engine, plugins=plugins)
    kinds = Counter(layer.type for layer in info.layers)
    want = {"KV_CACHE_UPDATE": kv_layers, "ATTENTION_INPUT": attention_layers,
            "ATTENTION_OUTPUT": attention_layers, "PLUGIN_V3": plugin_layers}
    assert {k: kinds.get(k, 0) for k in want} == want, info.table()
    record = json.loads(layers_path(engine).read_text())
    aliasing = state_aliasing(engine)
    presents = [o for o in record["outputs"] if o.startswith("present.")]
    assert presents and sorted(aliasing) == sorted(presents), aliasing
    for name, how in aliasing.items():
        expected = KV_CACHE if name.endswith((".key", ".value")) else PLUGIN
        assert how == expected, f"{name}: {how}, expected {expected} ({aliasing})"
    assert [p["name"] for p in record["profiles"]] == ["prefill", "decode"]
    assert record["trt"] and record["trt_version"]
    return record
