"""`gdn-export export --speculative K`: the verify form and the MTP head as their own ONNX files, each
checked in ONNX Runtime against PyTorch on ragged rows (the verify form at K + 1 tokens, the head at
one token and at several), and the flags that cannot apply refused before the work."""

from __future__ import annotations

import json
from collections import Counter

import onnx
import onnx.numpy_helper
import pytest

from gdn_export.errors import GdnExportError
from gdn_export.layout import DeployLayout
from gdn_export.onnx.speculative import (KEY_K, KEY_ROLE, VerifyForm, compare_in_ort, mtp_inputs,
                                         verify_inputs, verify_output_names)
from gdn_export.weights import load_checkpoint
from gdn_export.weights.mtp import load_mtp
from tests.mtp_checkpoints import MTP_FAMILIES, mtp_checkpoint

K, CACHE = 2, 24


@pytest.mark.slow
@pytest.mark.parametrize("family", MTP_FAMILIES)
def test_verify_and_mtp_graphs_match_pytorch(cli, tmp_path_factory, tmp_path, family):
    ckpt = mtp_checkpoint(family, tmp_path_factory.getbasetemp())
    out = tmp_path / "m.onnx"
    r = cli("export", ckpt, "-o", out, "--max-cache-len", CACHE, "--speculative", K, "-q")
    assert r.code == 0, r.err
    verify, head = tmp_path / "m.verify.onnx", tmp_path / "m.mtp.onnx"
    assert f"wrote {verify}" in r.out and f"wrote {head}" in r.out and out.is_file()
    model = load_checkpoint(ckpt)
    model.layout = DeployLayout.make(cache_len=CACHE)
    mtp = load_mtp(ckpt, model)
    proto = onnx.load(str(verify), load_external_data=False)
    meta = {p.key: p.value for p in proto.metadata_props}
    assert (meta[KEY_ROLE], meta[KEY_K]) == ("verify", str(K))
    assert [v.name for v in proto.graph.output] == verify_output_names(model)
    # one every-step gated-delta-rule node per GDN layer; the conv over the window in standard ONNX
    # (no in-place plugin node: TensorRT could not alias a state input another layer reads)
    ops = Counter(n.op_type for n in proto.graph.node if n.domain == "gdn")
    assert ops == {"GatedDeltaRuleSteps": model.config.layer_kinds.count("linear_attention"),
                   **({"MoE": len(model.config.layer_kinds)} if model.config.num_experts else {})}, ops
    for batch, seed in ((1, 1), (3, 2)):
        errors = compare_in_ort(verify, VerifyForm(model), verify_inputs(model, K, batch=batch, seed=seed))
        assert max(errors.values()) < 1e-5, errors
    for batch, seq, seed in ((1, 1, 3), (3, 4, 4)):
        errors = compare_in_ort(head, mtp, mtp_inputs(mtp, seq=seq, batch=batch, seed=seed))
        assert max(errors.values()) < 1e-5, errors
        assert set(errors) == {"logits", "mtp_hidden", "present.2.key", "present.2.value"}


def test_a_failed_head_export_leaves_nothing(cli, tmp_path_factory, tmp_path, monkeypatch):
    """The model's graph and the verify form are written before the head: a head that fails takes
    them with it."""
    import gdn_export.onnx.speculative as speculative

    ckpt = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())

    def broken(*_args, **_kwargs):
        raise GdnExportError("the head's export failed")

    monkeypatch.setattr(speculative, "export_mtp", broken)
    result = cli("export", ckpt, "-o", tmp_path / "m.onnx", "--max-cache-len", CACHE, "--speculative", K, "-q")
    assert "the head's export failed" in result.error_line("export")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra,message", [
    (["--speculative", 0], "--speculative must be in [1, 16], got 0"),
    (["--speculative", 2, "--onnx-ops", "standard"], "--speculative writes gdn nodes"),
    (["--speculative", 2, "--kv-cache", "concat"], "needs the inplace kv cache layout"),
    (["--speculative", 2, "--attention-window", 16], "without a streaming window"),
])
def test_flags_that_cannot_apply(cli, tmp_path_factory, tmp_path, extra, message):
    ckpt = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())
    assert message in cli("export", ckpt, "-o", tmp_path / "m.onnx", *extra).error_line("export")
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_without_a_head(cli, tiny_ckpt, tmp_path):
    result = cli("export", tiny_ckpt, "-o", tmp_path / "m.onnx", "--speculative", 2)
    assert "declares no multi-token-prediction head" in result.error_line("export")


def test_existing_verify_file_is_refused(cli, tmp_path_factory, tmp_path):
    ckpt = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())
    (tmp_path / "m.verify.onnx").write_bytes(b"x")
    result = cli("export", ckpt, "-o", tmp_path / "m.onnx", "--speculative", 2)
    assert "m.verify.onnx" in result.error_line("export")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """qwen3_5 with its head, exported with --speculative 3 (fp32): (checkpoint, folder)."""
    from gdn_export.cli.main import main

    ckpt = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())
    out = tmp_path_factory.mktemp("spec-validate")
    assert main(["export", str(ckpt), "-o", str(out / "m.onnx"), "--max-cache-len", str(CACHE),
                 "--speculative", "3", "-q"]) == 0
    return ckpt, out


@pytest.mark.parametrize("graph", ["verify", "mtp"])
def test_validate_checks_the_speculative_graphs(cli, exported, tmp_path, graph):
    ckpt, out = exported
    report = tmp_path / "r.json"
    r = cli("validate", ckpt, "--onnx", out / f"m.{graph}.onnx", "--batch", 3, "--prompt-len", 4, "-q",
            "--json", report)
    assert r.code == 0, r.err
    assert r.out.strip().splitlines()[-1].startswith("PASS: ")
    data = json.loads(report.read_text())
    assert data["passed"] and data["role"] == graph and all(row["error"] < 1e-4 for row in data["rows"])
    assert {row["call"] for row in data["rows"]} == ({"verify B1 x 4", "verify B3 x 4"} if graph == "verify"
                                                      else {"mtp B1 x 1", "mtp B3 x 4"})
    r = cli("validate", ckpt, "--onnx", out / f"m.{graph}.onnx", "--batch", 30, "-q")
    if graph == "verify":  # 30 rows at pasts 1 .. 30 and 4 tokens: past the 24 slots
        assert "--batch 30 rows of 4 tokens at pasts 1 .. 30 do not fit" in r.error_line("validate")
    else:
        assert "--batch 30 rows at pasts 2 .. 31 do not fit the head's cache of 24 slots" in r.error_line("validate")
    # a bound nothing meets fails, with exit 1 and the first output named
    r = cli("validate", ckpt, "--onnx", out / f"m.{graph}.onnx", "--rtol", "1e-12", "-q")
    assert r.code == 1 and r.out.strip().splitlines()[-1].startswith("FAIL: ")


def test_validate_finds_a_wrong_head(cli, exported, tmp_path):
    """The head's graph with one weight changed is over tolerance."""
    ckpt, out = exported
    proto = onnx.load(str(out / "m.mtp.onnx"))
    weight = next(t for t in proto.graph.initializer if t.name == "embed_tokens.weight")  # the head's own copy
    values = onnx.numpy_helper.to_array(weight).copy()
    values.flat[::7] *= 1.5
    weight.CopyFrom(onnx.numpy_helper.from_array(values, weight.name))
    onnx.save(proto, str(tmp_path / "m.mtp.onnx"))
    r = cli("validate", ckpt, "--onnx", tmp_path / "m.mtp.onnx", "-q")
    assert r.code == 1 and "FAIL" in r.out


@pytest.mark.parametrize("extra,message", [
    (["--engine", "x.engine"], "validate it alone (no --engine)"),
    (["--ort-device", "cuda"], "validated in ONNX Runtime on the CPU"),
    (["--atol", "1e-3"], "--atol does not apply to the verify graph"),
    (["--rtol", "present.9.key:0.1"], "--rtol present.9.key: no such output of"),
])
def test_validate_speculative_mistakes(cli, exported, extra, message):
    ckpt, out = exported
    assert message in cli("validate", ckpt, "--onnx", out / "m.verify.onnx", *extra).error_line("validate")


@pytest.mark.parametrize("graph", ["verify", "mtp"])
def test_run_names_a_speculative_graph(cli, exported, graph):
    _, out = exported
    line = cli("run", out / f"m.{graph}.onnx", "--input-ids", "1,2", "--max-new-tokens", 1).error_line("run")
    assert f"the {graph} graph of `export --speculative`" in line
