"""Speculative decoding over the exported graphs in ONNX Runtime (gdn_export.runtime.ort_speculative,
`gdn-export run model.onnx --speculative K`): greedy tokens equal plain greedy decoding of the
model's own graph in ONNX Runtime for ragged prompts (one token, short, longer than a verify
window), in fp32 (qwen3_5_moe: GDN, attention and MoE layers and an MoE head) and bf16 (qwen3_5); the
runner reads the graphs' state names and metadata only, nothing of a family; sampling is reproducible by its seed (its rule is the
torch runtime's rejection_accept, whose law tests/runtime/test_speculative.py checks); graphs that
are missing, of another K or of another role are refused by name before any work."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_export.cli.main import main
from gdn_export.runtime.base import generate
from gdn_export.runtime.ort_runner import OrtRunner
from gdn_export.runtime.ort_speculative import OrtSpeculativeDecoder
from tests.cli.conftest import cli  # noqa: F401  (the fixture)
from tests.mtp_checkpoints import mtp_checkpoint

K, CACHE = 2, 40
LENGTHS, NEW = (1, 5, 11), 9


def _export(root, family: str, dtype: str = "fp32"):
    ckpt = mtp_checkpoint(family, root)
    out = root / f"{family}-{dtype}" / "m.onnx"
    out.parent.mkdir(exist_ok=True)
    if not out.is_file():
        assert main(["export", str(ckpt), "-o", str(out), "--dtype", dtype, "--max-cache-len", str(CACHE),
                     "--speculative", str(K), "-q"]) == 0
    return out


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return _export(tmp_path_factory.getbasetemp(), "qwen3_5_moe")


def _check_greedy(graph):
    verify, mtp = graph.with_name("m.verify.onnx"), graph.with_name("m.mtp.onnx")
    plain = OrtRunner(graph)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, plain.vocab_size, n) for n in LENGTHS]
    result = OrtSpeculativeDecoder(verify, mtp).generate(prompts, NEW)
    want = generate(plain, prompts, NEW).generated
    assert result.generated.shape == (len(prompts), NEW)
    assert np.array_equal(result.generated, want), (result.generated, want)
    assert result.rounds >= 1 and 1 <= result.tokens_per_step <= K + 1
    for p, row in zip(prompts, result.rows()):  # each row alone too
        alone = OrtSpeculativeDecoder(verify, mtp).generate([p], NEW).rows()[0]
        assert np.array_equal(alone, row)


def test_greedy_equals_plain_greedy_of_the_models_graph(moe):
    _check_greedy(moe)


@pytest.mark.slow
def test_greedy_bf16(tmp_path_factory):
    """A bf16 export (ONNX Runtime runs it as fp32 tensors rounded to bf16), a dense family."""
    _check_greedy(_export(tmp_path_factory.getbasetemp(), "qwen3_5", "bf16"))


def test_sampling_is_seeded_and_valid(moe):
    verify, mtp = moe.with_name("m.verify.onnx"), moe.with_name("m.mtp.onnx")
    prompts = [np.array([5, 9, 2]), np.array([7])]
    a = OrtSpeculativeDecoder(verify, mtp, temperature=1.0, seed=4).generate(prompts, 12)
    b = OrtSpeculativeDecoder(verify, mtp, temperature=1.0, seed=4).generate(prompts, 12)
    c = OrtSpeculativeDecoder(verify, mtp, temperature=1.0, seed=5).generate(prompts, 12)
    assert np.array_equal(a.generated, b.generated) and not np.array_equal(a.generated, c.generated)
    assert a.generated.min() >= 0 and a.generated.max() < OrtRunner(moe).vocab_size


def test_run_cli_prints_plain_greedys_lines(cli, moe):  # noqa: F811
    spec = cli("run", moe, "--input-ids", "4,8,15,16,23", "--input-ids", "42", "--max-new-tokens", 6,
               "--speculative", K)
    plain = cli("run", moe, "--input-ids", "4,8,15,16,23", "--input-ids", "42", "--max-new-tokens", 6)
    assert spec.code == 0 and plain.code == 0, spec.err
    assert spec.out == plain.out and "tokens per verify step" in spec.err


def test_bad_graphs(cli, moe, tmp_path):  # noqa: F811
    assert "verifies K = 2 drafts a round; run it with --speculative 2" in cli(
        "run", moe, "--input-ids", "1,2", "--speculative", 3).error_line("run")
    lone = tmp_path / "lone.onnx"
    lone.write_bytes(moe.read_bytes())
    assert "runs lone.verify.onnx beside it, which is missing" in cli(
        "run", lone, "--input-ids", "1,2", "--speculative", K).error_line("run")
    assert "runs ONNX Runtime on the CPU" in cli(
        "run", moe, "--input-ids", "1,2", "--speculative", K, "--device", "cuda").error_line("run")
    assert "--prefill-chunk does not apply" in cli(
        "run", moe, "--input-ids", "1,2", "--speculative", K, "--prefill-chunk", 4).error_line("run")
    with pytest.raises(Exception, match="not the verify graph"):
        OrtSpeculativeDecoder(moe.with_name("m.mtp.onnx"), moe.with_name("m.mtp.onnx"))
    with pytest.raises(Exception, match="needs 1[0-9]+ cache slots; the graphs have 40"):
        OrtSpeculativeDecoder(moe.with_name("m.verify.onnx"), moe.with_name("m.mtp.onnx")).generate([[1] * 30], 80)
