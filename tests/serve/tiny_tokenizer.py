"""A byte-level BPE tokenizer of exactly 256 tokens (the tiny checkpoints' vocabulary), trained with the
`tokenizers` library on a seeded made-up corpus (nothing downloaded), saved with a ChatML chat template
as transformers writes it (tokenizer.json, tokenizer_config.json, chat_template.jinja)."""

from __future__ import annotations

import random
import string
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2; <|im_end|> ends a turn (eos)
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
VOCAB = 256


def _corpus(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    syllables = [a + b for a in "bcdfghklmnprstvwz" for b in "aeiou"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(400)]
    return [" ".join(rng.choice(words) for _ in range(12)) + rng.choice(".,!?") for _ in range(300)]


def write_tokenizer(folder: str | Path, chat_template: bool = True) -> Path:
    """Train the tokenizer and save it into `folder` (a checkpoint folder); returns the folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    # Every printable ASCII character (and newline) as a base token: any ASCII text encodes.
    alphabet = sorted({c for ch in string.printable for piece, _ in byte_level.pre_tokenize_str(ch) for c in piece})
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE if chat_template else None)
    fast.save_pretrained(str(folder))
    return Path(folder)
