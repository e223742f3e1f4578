"""TextStream: token by token it gives the text the whole decode gives (multi-byte characters split
over byte tokens come out whole), cuts at the first stop string wherever the token boundaries fall,
and releases held-back text when the generation ends without one."""

from __future__ import annotations

import pytest

from gdn_export.serve.text import TextStream


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|end|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, hello there. über naïve café 🙂"] * 20, trainer)
    return tok


TEXT = "hello world! über café 🚀 done"  # 🚀 is not in the training text: four byte tokens


def _stream(tok, stop=(), ids=None):
    ids = tok.encode(TEXT).ids if ids is None else ids
    ts = TextStream(tok, stop)
    pieces = [ts.push(t) for t in ids]
    return ts, pieces


def test_pieces_add_up_to_the_whole_decode(tokenizer):
    ids = tokenizer.encode(TEXT).ids
    ts, pieces = _stream(tokenizer)
    assert "".join(pieces) + ts.flush() == tokenizer.decode(ids) == TEXT
    # the rocket's bytes come as several tokens: "" until it is whole, then all of it at once
    assert len(tokenizer.encode("🚀").ids) > 1
    assert " 🚀" in pieces and not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("stop,want", [(["o w"], "hell"), (["café", "ü"], "hello world! "), (["h"], ""),
                                       (["🚀"], "hello world! über café "), (["d!"], "hello worl")],
                         ids=["across-tokens", "earliest-of-two", "at-start", "multibyte", "after-held"])
def test_cuts_at_the_first_stop_string(tokenizer, stop, want):
    ts, pieces = _stream(tokenizer, stop)
    assert "".join(pieces) == want and ts.stopped
    assert ts.push(tokenizer.encode("x").ids[0]) == "" and ts.flush() == ""


def test_held_back_text_is_released_at_the_end(tokenizer):
    ts, pieces = _stream(tokenizer, ["done!"])  # the text ends with "done", a prefix of the stop string
    assert not ts.stopped and "".join(pieces) == TEXT[:-len("done")]
    assert ts.flush() == "done"


def test_special_and_unknown_tokens_give_no_text(tokenizer):
    end = tokenizer.token_to_id("<|end|>")
    ts, pieces = _stream(tokenizer, ids=tokenizer.encode("hi").ids + [end, 10**6])
    assert "".join(pieces) == "hi"
