"""`gdn-export run`: torch and ONNX Runtime agree token for token and logit for logit; malformed
prompts and flags end in one line with exit status 2 before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

PROMPTS = ["5,17,200,3,91,42,7", "250,0,13"]  # B = 2, ragged: 7 and 3 tokens
LENGTHS = [7, 3]
NEW_TOKENS = 5


@pytest.fixture(scope="module")
def both_backends(tmp_path_factory, tiny_ckpt, tiny_onnx):
    """{backend: (stdout, npz)} for the same prompts on torch and ort."""
    from gdn_export.cli.main import main

    out_dir = tmp_path_factory.mktemp("run")
    results = {}
    for backend, model in (("torch", tiny_ckpt), ("ort", tiny_onnx)):
        npz = out_dir / f"{backend}.npz"
        argv = ["run", str(model), "--max-new-tokens", str(NEW_TOKENS), "--save-logits", str(npz), "-q"]
        for row in PROMPTS:
            argv += ["--input-ids", row]
        assert main(argv) == 0
        results[backend] = npz
    assert sorted(p.name for p in out_dir.iterdir()) == ["ort.npz", "torch.npz"]  # no temp left
    return {k: dict(np.load(v)) for k, v in results.items()}


def test_same_tokens(both_backends):
    generated = {k: v["generated"] for k, v in both_backends.items()}
    assert generated["torch"].shape == (2, NEW_TOKENS)
    np.testing.assert_array_equal(generated["ort"], generated["torch"])
    for saved in both_backends.values():
        np.testing.assert_array_equal(saved["prompt_lengths"], LENGTHS)


def test_saved_logits_match(both_backends):
    torch_npz, ort_npz = both_backends["torch"], both_backends["ort"]
    steps = sorted(k for k in torch_npz if k.startswith("step_"))
    assert steps == sorted(k for k in ort_npz if k.startswith("step_"))
    assert len(steps) == NEW_TOKENS  # the prefill, then one step per token but the last
    assert torch_npz["step_0"].shape == (2, 1, 256)  # each row's last prompt token
    assert all(torch_npz[f"step_{i}"].shape == (2, 1, 256) for i in range(1, NEW_TOKENS))
    assert torch_npz["step_0"].std() > 0.1  # real logits, not a constant that trivially matches
    for step in steps:
        assert np.isfinite(torch_npz[step]).all()
        np.testing.assert_allclose(ort_npz[step], torch_npz[step], rtol=0, atol=1e-4, err_msg=step)


def test_stdout_is_the_token_table(cli, tiny_onnx, both_backends):
    result = cli("run", tiny_onnx, "--input-ids", PROMPTS[0], "--input-ids", PROMPTS[1],
                 "--max-new-tokens", NEW_TOKENS, "-q")
    assert result.code == 0 and result.err == ""
    printed = [[int(t) for t in line.split()] for line in result.out.splitlines()]
    for row, prompt, generated in zip(printed, PROMPTS, both_backends["ort"]["generated"]):
        assert row == [int(t) for t in prompt.split(",")] + generated.tolist()


def test_zero_new_tokens_prints_the_prompt(cli, tiny_onnx, tmp_path):
    result = cli("run", tiny_onnx, "--input-ids", "1,2,3", "--max-new-tokens", 0, "-q",
                 "--save-logits", tmp_path / "l.npz")
    assert result.code == 0 and result.out == "1 2 3\n"
    saved = np.load(tmp_path / "l.npz")
    assert sorted(saved.files) == ["generated", "prompt_lengths", "step_0"]
    assert saved["step_0"].shape == (1, 1, 256) and saved["generated"].shape == (1, 0)


@pytest.mark.parametrize("args,fragment", [
    (["--input-ids", ""], "--input-ids '' is empty"),
    (["--input-ids", ","], "--input-ids ',' is empty"),
    (["--input-ids", "1,x,3"], "--input-ids '1,x,3': token ids must be integers"),
    (["--input-ids", "1.5"], "token ids must be integers, got '1.5'"),
    (["--input-ids", "1_0"], "token ids must be integers, got '1_0'"),
    (["--input-ids", "2,\uff11"], "token ids must be integers, got '\uff11'"),
    (["--input-ids", "99999999999999999999"], "token id 99999999999999999999 is out of range"),
    (["--input-ids", "1,256"], "token id 256 is out of range for vocab size 256 (0 .. 255)"),
    (["--input-ids", "-1"], "token ids must be >= 0, got '-1'"),
    (["--input-ids", "1", "--max-new-tokens", "4100"], "needs 4100 cache slots; the model has 4096"),
    (["--input-ids", "1", "--prefill-chunk", "0"], "--prefill-chunk must be >= 1, got 0"),
    (["--input-ids", "1", "--max-new-tokens", "-1"], "--max-new-tokens must be >= 0, got -1"),
    (["--input-ids", "1", "--save-logits", "no/such/dir/l.npz"], "folder no/such/dir does not exist"),
], ids=["empty", "only-commas", "not-integer", "float", "underscore", "full-width-digit", "int64-overflow",
        "id-equals-vocab", "negative-id", "longer-than-cache", "prefill-chunk-0",
        "negative-new-tokens", "save-logits-folder-missing"])
def test_bad_prompt_or_flag(cli, tiny_onnx, args, fragment):
    result = cli("run", tiny_onnx, *args)  # no -q: the error must still be the only stderr line
    assert fragment in result.error_line("run")
    assert result.out == ""


@pytest.mark.parametrize("model,args,fragment", [
    ("{tmp}/model.bin", [], "cannot tell the backend"),
    ("{onnx}", ["--backend", "torch"], "--backend torch needs a checkpoint folder"),
    ("{tmp}/gone.onnx", [], "gone.onnx: no such ONNX file"),
    ("{ckpt}", ["--device", "nonsense"], "--device 'nonsense' is not a torch device"),
    ("{ckpt}", ["--op-backend", "cuda"], "--op-backend cuda needs --device cuda"),
    ("{ckpt}", ["--backend", "ort"], "{ckpt}: is a folder, expected an ONNX file"),
    ("{onnx}", ["--dtype", "fp16"], "--dtype applies to the torch backend only; {onnx} runs on ort"),
    ("{onnx}", ["--device", "tpu"], "--device 'tpu': ONNX Runtime runs on cpu, cuda or cuda:N"),
    ("{ckpt}", ["--plugins", "lib.so"], "--plugins applies to the trt backend only"),
], ids=["unknown-suffix", "torch-on-onnx", "missing-file", "bad-device", "cuda-ops-on-cpu",
        "ort-on-folder", "dtype-of-an-onnx", "device-of-an-onnx", "plugins-for-torch"])
def test_bad_model_or_backend(cli, tmp_path, tiny_ckpt, tiny_onnx, model, args, fragment):
    (tmp_path / "model.bin").write_bytes(b"")
    fill = lambda s: s.format(tmp=tmp_path, onnx=tiny_onnx, ckpt=tiny_ckpt)  # noqa: E731
    result = cli("run", fill(model), "--input-ids", "1,2", *args)
    assert fill(fragment) in result.error_line("run")


def test_prefill_chunk_gives_the_same_tokens(cli, tiny_onnx, both_backends):
    argv = ["run", tiny_onnx, "--max-new-tokens", NEW_TOKENS, "--prefill-chunk", 2, "-q"]
    for row in PROMPTS:
        argv += ["--input-ids", row]
    printed = [[int(t) for t in line.split()] for line in cli(*argv).out.splitlines()]
    assert [row[n:] for row, n in zip(printed, LENGTHS)] == both_backends["ort"]["generated"].tolist()


def test_corrupt_onnx_file(cli, tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"not protobuf \xff\xfe")
    message = cli("run", tmp_path / "junk.onnx", "--input-ids", "1").error_line("run")
    assert message.startswith(f"{tmp_path / 'junk.onnx'}: not an ONNX model"), message


@pytest.mark.parametrize("backend,hint", [("triton", "use the reference backend or set TRITON_INTERPRET=1"),
                                          ("cuda", "use the reference backend")])
def test_gpu_op_backend_from_the_environment_on_cpu(cli, monkeypatch, tiny_ckpt, backend, hint):
    """GDN_EXPORT_BACKEND skips the --op-backend flag check: the ops themselves say it in one line."""
    monkeypatch.setenv("GDN_EXPORT_BACKEND", backend)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    message = cli("run", tiny_ckpt, "--input-ids", "1,2", "-q").error_line("run")
    assert message == f"gdn backend '{backend}' needs CUDA tensors (got cpu); {hint}"
