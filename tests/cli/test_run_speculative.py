"""`gdn-export run --speculative K`: the plain greedy tokens, sampling, and every flag that cannot apply
refused in one line before the work."""

from __future__ import annotations

import pytest

from tests.mtp_checkpoints import mtp_checkpoint


@pytest.fixture(scope="module")
def mtp_ckpt(tmp_path_factory):
    return mtp_checkpoint("qwen3_next", tmp_path_factory.getbasetemp())


def test_greedy_prints_the_plain_tokens(cli, mtp_ckpt):
    ids = ["--input-ids", "5,7,9,11", "--input-ids", "3", "--max-new-tokens", 9]
    plain = cli("run", mtp_ckpt, *ids)
    spec = cli("run", mtp_ckpt, *ids, "--speculative", 3)
    assert plain.code == 0 and spec.code == 0, spec.err
    assert spec.out == plain.out and len(spec.out.splitlines()) == 2
    assert "K = 3 drafts from the MTP head, greedy" in spec.err and "tokens per verify step" in spec.err


def test_sampling_is_seeded(cli, mtp_ckpt):
    argv = ["run", mtp_ckpt, "--input-ids", "5,7,9", "--max-new-tokens", 8, "--speculative", 2,
            "--temperature", 0.9, "--seed", 4]
    first, again = cli(*argv), cli(*argv)
    assert first.code == 0 and first.out == again.out and "temperature 0.9" in first.err


@pytest.mark.parametrize("extra,message", [
    (["--speculative", 0], "--speculative must be in [1, 16], got 0"),
    (["--temperature", 0.5], "--temperature applies to --speculative"),
    (["--speculative", 2, "--temperature", -1], "--temperature must be a finite number >= 0"),
    (["--speculative", 2, "--save-logits", "x.npz"], "--save-logits is not kept with --speculative"),
])
def test_flags_that_cannot_apply(cli, mtp_ckpt, tmp_path, extra, message):
    result = cli("run", mtp_ckpt, "--input-ids", "1,2", *[str(tmp_path / e) if e == "x.npz" else e for e in extra])
    assert message in result.error_line("run")


def test_checkpoint_without_a_head(cli, tiny_ckpt):
    result = cli("run", tiny_ckpt, "--input-ids", "1,2", "--speculative", 2)
    assert "declares no multi-token-prediction head" in result.error_line("run")


def test_exported_model_without_its_speculative_graphs_is_refused(cli, tmp_path):
    """An exported model runs --speculative over the verify and head graphs beside it
    (tests/runtime/test_ort_speculative.py); without them, one line naming the missing file."""
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"x")
    result = cli("run", onnx, "--input-ids", "1,2", "--speculative", 2)
    assert "runs m.verify.onnx beside it, which is missing" in result.error_line("run")
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"x")
    result = cli("run", engine, "--input-ids", "1,2", "--speculative", 2)
    assert "--speculative runs a checkpoint folder (torch) or the exported graphs (ort)" in result.error_line("run")


def test_bench_speculative(cli, mtp_ckpt, tmp_path):
    """bench --speculative K: the keys of gdn_export.runtime.spec_bench, the plain greedy tokens."""
    import json

    out = tmp_path / "bench.json"
    r = cli("bench", mtp_ckpt, "--batch", 2, "--prompt-len", 7, "--decode-steps", 5, "--warmup", 0,
            "--repeats", 1, "--dtype", "fp32", "--speculative", 2, "-q", "--json", out)
    assert r.code == 0, r.err
    spec = json.loads(out.read_text())["speculative"]
    assert spec["tokens_equal_plain"] is True and spec["k"] == 2 and spec["cuda_graph"] is False
    assert 1.0 <= spec["tokens_per_step"] <= 3.0 and spec["rounds"] >= 2
    for key in ("decode_tokens_per_s", "round_ms", "draft_ms", "verify_ms", "speedup", "verify_over_plain_step"):
        assert spec[key] > 0, key
    assert "speculative, K = 2 (greedy, MTP head, CUDA graph off)" in r.out


@pytest.mark.parametrize("extra,message", [
    (["--speculative", 17], "--speculative must be in [1, 16], got 17"),
    (["--speculative", 2, "--quant", "fp8"], "--speculative times the checkpoint as it is"),
])
def test_bench_speculative_errors(cli, mtp_ckpt, extra, message):
    assert message in cli("bench", mtp_ckpt, *extra).error_line("bench")


def test_bench_speculative_needs_a_head(cli, tiny_ckpt):
    assert "declares no multi-token-prediction head" in cli("bench", tiny_ckpt, "--speculative", 2).error_line("bench")


def test_agreement_names_rows_and_first_difference():
    """spec_bench.agreement: all equal, or how many rows are and where the earliest difference is."""
    import numpy as np

    from gdn_export.runtime.spec_bench import agreement

    want = np.arange(12).reshape(3, 4)
    assert agreement(want.copy(), want) == {"tokens_equal_plain": True, "rows_equal_plain": 3,
                                            "first_difference": None}
    got = want.copy()
    got[1, 3] = -1
    got[2, 2] = -1
    assert agreement(got, want) == {"tokens_equal_plain": False, "rows_equal_plain": 1, "first_difference": 2}


def test_difference_margin_measures_the_models_gap_where_a_row_first_differs(mtp_ckpt):
    """spec_bench.difference_margin: the row and position of the earliest difference, the model's top-2
    logit gap there (recomputed from the row's prompt and plain tokens before it) and the rank of the
    speculative token; nothing when no row differs."""
    import numpy as np
    import torch

    from gdn_export.layout import DeployLayout
    from gdn_export.runtime.base import generate
    from gdn_export.runtime.spec_bench import difference_margin
    from gdn_export.runtime.torch_runner import TorchRunner
    from gdn_export.weights import load_checkpoint

    model = load_checkpoint(mtp_ckpt, dtype=torch.float32)
    model.layout = DeployLayout.make(cache_len=64)
    runner = TorchRunner(model)
    prompts = np.random.default_rng(2).integers(0, model.config.vocab_size, (2, 6))
    want = generate(runner, prompts, 5).generated
    assert difference_margin(runner, prompts, want.copy(), want) == {}
    got = want.copy()
    got[1, 2] = (want[1, 2] + 1) % model.config.vocab_size
    got[0, 4] = (want[0, 4] + 1) % model.config.vocab_size
    out = difference_margin(runner, prompts, got, want)
    logits, _ = runner.forward(np.concatenate([prompts[1], want[1, :2]])[None], 0, runner.empty_states(1))
    top = torch.as_tensor(logits[0, -1]).double().topk(2).values
    assert out["difference_row"] == 1 and out["difference_gap"] == pytest.approx(float(top[0] - top[1]))
    assert out["difference_rank"] >= 1 and out["difference_logit"] == pytest.approx(float(top[0]))
