"""benchmarks/train_small.py: the folder it writes loads in transformers and gdn-export (export and
run), the weights are the ones it measured, the tokenizer round-trips, the MTP head is causal and
stored under Qwen3.5's names, and bad arguments stop before any work."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import mtp_head
import stdlib_corpus as corpus
import train_small


def test_folder_holds_the_model_tokenizer_mtp_and_record(trained_tiny):
    from safetensors import safe_open

    names = {p.name for p in trained_tiny.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "train_small.json"} <= names
    config = json.loads((trained_tiny / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"] and config["dtype"] == "bfloat16"
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert config["mtp_num_hidden_layers"] == 1
    assert "<|im_start|>" in json.loads((trained_tiny / "tokenizer_config.json").read_text())["chat_template"]
    H = config["hidden_size"]
    with safe_open(trained_tiny / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert f.get_slice("mtp.fc.weight").get_shape() == [H, 2 * H]
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    assert {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
            "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.down_proj.weight"} <= keys
    record = json.loads((trained_tiny / "train_small.json").read_text())
    assert record["steps"] == 3 and record["tokens_seen"] == 3 * record["batch"] * record["seq_len"]
    assert record["corpus"] == corpus.describe()
    assert 1 < record["heldout"]["ppl"] < 300 and 0 <= record["mtp"]["heldout_top1"] <= 1  # vocab 300
    assert 0 <= record["mtp"]["heldout_agree"] <= 1
    assert record["mtp"]["distill"]["fraction"] == 0.5 and record["mtp"]["distill"]["steps"] == 1
    assert record["mtp"]["distill"]["final_loss"] > 0


def test_transformers_loads_it_and_measures_the_recorded_perplexity(trained_tiny):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(trained_tiny, dtype=torch.bfloat16).eval()
    tok = transformers.AutoTokenizer.from_pretrained(trained_tiny)
    record = json.loads((trained_tiny / "train_small.json").read_text())
    T, n = record["seq_len"], record["heldout"]["windows"]
    windows = corpus.heldout_windows(corpus.encode(tok, corpus.read(corpus.split_files()["heldout"])), T, n)
    assert np.array_equal(windows, corpus.heldout_windows(corpus.heldout_stream(tok, T * n), T, n))
    got = train_small.evaluate(model, None, windows, 4, torch.device("cpu"))
    assert got["tokens"] == record["heldout"]["tokens"]
    assert math.isclose(got["ppl"], record["heldout"]["ppl"], rel_tol=1e-6), (got, record["heldout"])


def test_gdn_export_model_matches_transformers(trained_tiny):
    """gdn-export loads the folder (mtp.* skipped) and computes transformers' logits."""
    import transformers

    from gdn_export.layout import DeployLayout
    from gdn_export.weights import load_checkpoint

    ids = torch.as_tensor(np.random.default_rng(0).integers(3, 300, (2, 37)))
    ref = transformers.AutoModelForCausalLM.from_pretrained(trained_tiny, dtype=torch.float32).eval()
    ours = load_checkpoint(trained_tiny, dtype=torch.float32)
    ours.layout = DeployLayout.make(logits="all", cache_len=64)
    with torch.no_grad():
        a = ref(input_ids=ids).logits
        b = ours(ids, torch.zeros(2, dtype=torch.long), torch.full((2,), 37), *ours.empty_states(2))[0]
    rel = float((a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt())
    assert rel < 2e-3, rel


def test_gdn_export_runs_it(trained_tiny, capsys):
    from gdn_export.cli.main import main

    assert main(["run", str(trained_tiny), "--input-ids", "5,6,7,8", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.strip()


@pytest.mark.slow
def test_gdn_export_exports_it(trained_tiny, tmp_path):
    """~8 s: a four-layer export, validated against the PyTorch model in ONNX Runtime."""
    from gdn_export.cli.main import main

    onnx_path = tmp_path / "m.onnx"
    assert main(["export", str(trained_tiny), "-o", str(onnx_path), "-q"]) == 0
    assert main(["validate", str(trained_tiny), "--onnx", str(onnx_path), "-q"]) == 0


def test_tokenizer_round_trips(trained_tiny):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(trained_tiny)
    texts = corpus.read(corpus.split_files()["heldout"][:3])
    texts += ["def f(x):\n\treturn x  # ünïcode ✓ 数字\n", "\x00\x7f\r\n  "]
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    assert [tok.convert_tokens_to_ids(t) for t in corpus.SPECIAL] == [0, 1, 2]
    assert tok.eos_token_id == 0
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_split_is_by_file_and_stable():
    files = corpus.list_files()
    held = [f for f in files if corpus.held_out(f)]
    assert 0.02 < len(held) / len(files) < 0.08  # HELD_OUT_PERCENT = 5 of the files, by crc32
    assert corpus.held_out(held[0]) and corpus.describe()["heldout_files"] == len(held)
    assert not any(part in ("site-packages", "__pycache__") for f in files for part in f.parts)


def test_mtp_head_is_causal_and_predicts_two_ahead():
    """Changing token j changes the MTP logits of positions >= j - 1 only (position t reads
    token t + 1), and the output is [B, T, V]."""
    import transformers

    torch.manual_seed(0)
    config = train_small.model_config("tiny", 300)
    model = transformers.Qwen3_5ForCausalLM(config).eval()
    head = mtp_head.MtpHead(config).eval()
    ids = torch.randint(3, 300, (1, 12))
    with torch.no_grad():
        def run(x):
            hidden = model.model(input_ids=x[:, :-1]).last_hidden_state
            return mtp_head.mtp_logits(model, head, x[:, 1:], hidden)
        a = run(ids)
        changed = ids.clone()
        changed[0, 8] = (ids[0, 8] + 1) % 300
        b = run(changed)
    assert a.shape == (1, 11, 300)
    assert torch.equal(a[:, :7], b[:, :7]) and not torch.allclose(a[:, 7], b[:, 7])


def test_losses_and_the_distillation_target():
    """losses: CE of the model's logits against token t+1 and of the head's against token t+2;
    distill_loss: cross-entropy of the head's logits for token t+2 against the model's own
    distribution over it (its logits at t+1). Each written out here position by position."""
    import transformers

    torch.manual_seed(1)
    config = train_small.model_config("tiny", 300)
    model = transformers.Qwen3_5ForCausalLM(config)
    head = mtp_head.MtpHead(config)
    ids = torch.randint(3, 300, (2, 9))
    with torch.no_grad():
        main, side = train_small.losses(model, head, ids)
        soft_loss = train_small.distill_loss(model, head, ids)
        hidden = model.model(input_ids=ids[:, :-2]).last_hidden_state
        logits = model.lm_head(hidden).double()
        drafts = mtp_head.mtp_logits(model, head, ids[:, 1:-1], hidden).double()
    T = ids.shape[1] - 2
    ce = lambda x, t: -x.log_softmax(-1)[t]  # noqa: E731
    assert main.item() == pytest.approx(float(sum(ce(logits[b, t], ids[b, t + 1]) for b in range(2)
                                                  for t in range(T)) / (2 * T)), rel=1e-5)
    assert side.item() == pytest.approx(float(sum(ce(drafts[b, t], ids[b, t + 2]) for b in range(2)
                                                  for t in range(T)) / (2 * T)), rel=1e-5)
    soft = sum(-(logits[b, t + 1].softmax(-1) * drafts[b, t].log_softmax(-1)).sum()
               for b in range(2) for t in range(T - 1)) / (2 * (T - 1))
    assert soft_loss.item() == pytest.approx(float(soft), rel=1e-5)


def test_head_only_phase_trains_the_head_alone():
    """distill_loss with the model frozen (as the phase runs it): gradients reach the head's own
    parameters and no parameter of the model (the lm_head and embedding it shares included)."""
    import transformers

    torch.manual_seed(2)
    config = train_small.model_config("tiny", 300)
    model = transformers.Qwen3_5ForCausalLM(config)
    head = mtp_head.MtpHead(config)
    for p in model.parameters():
        p.requires_grad_(False)
    train_small.distill_loss(model, head, torch.randint(3, 300, (2, 9))).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters() if p.dim() > 1)
    assert all(p.grad is None for p in model.parameters())


def test_lr_schedule():
    assert train_small.lr_factor(0.0) == pytest.approx(1e-3)
    assert train_small.lr_factor(train_small.WARMUP) == pytest.approx(1.0)
    assert train_small.lr_factor(1.0) == pytest.approx(train_small.FINAL_LR)
    xs = [train_small.lr_factor(x / 100) for x in range(4, 101)]
    assert all(a >= b for a, b in zip(xs, xs[1:]))


@pytest.mark.parametrize("argv,message", [
    (["--minutes", "0"], "--minutes must be > 0"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--batch", "-1"], "--batch must be >= 1"),
    (["--device", "tpu9"], "is not a torch device"),
    (["--mtp-distill", "1"], "--mtp-distill must be in [0, 1), got 1.0"),
], ids=["minutes", "steps", "batch", "device", "distill"])
def test_bad_arguments_stop_first(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        train_small.main([str(tmp_path / "out"), "--preset", "tiny", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_overwrite(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    with pytest.raises(SystemExit) as exc:
        train_small.main([str(tmp_path / "out"), "--preset", "tiny"])
    assert exc.value.code == 2 and "give --overwrite" in capsys.readouterr().err
