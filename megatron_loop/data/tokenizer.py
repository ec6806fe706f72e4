"""Tokenizers: loading a hub/local fast tokenizer (App. A.1) and training a small local BPE.

The paper uses the Llama-3.1-8B and Qwen3-0.6B tokenizers; tests and the quickstart use a
byte-level BPE trained here on the generated corpus (no download), saved as a transformers
fast-tokenizer folder that ``AutoTokenizer.from_pretrained(folder)`` loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from megatron_loop.errors import LoopDataError

EOS_TOKEN = "<|endoftext|>"


def load_tokenizer(name_or_dir: str, eos_token: str | None = None):
    """A transformers fast tokenizer with an EOS token (every document ends with EOS).

    ``eos_token`` overrides the tokenizer's own EOS (it must already be in the vocabulary).
    """
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name_or_dir, use_fast=True)
    except Exception as e:  # hub/offline/missing-folder errors come in many types
        raise LoopDataError(f"cannot load tokenizer '{name_or_dir}': {e}; expected a Hugging Face "
                            "hub name or a folder saved with save_pretrained") from None
    if not getattr(tok, "is_fast", False):
        raise LoopDataError(f"tokenizer '{name_or_dir}' is not a fast tokenizer; expected one "
                            "backed by the tokenizers library")
    if eos_token is not None:
        eos_id = tok.convert_tokens_to_ids(eos_token)
        if eos_id is None or eos_id == tok.unk_token_id:
            raise LoopDataError(f"tokenizer '{name_or_dir}' has no token '{eos_token}' "
                                "(given as the EOS token)")
        tok.eos_token = eos_token
    if tok.eos_token_id is None:
        raise LoopDataError(f"tokenizer '{name_or_dir}' has no EOS token; expected eos_token to be "
                            "set (documents are terminated with EOS, App. A.1), or pass --eos-token")
    return tok


def train_bpe_tokenizer(texts: Iterable[str], output_dir: str | Path, vocab_size: int = 2048,
                        min_frequency: int = 2) -> Path:
    """Train a byte-level BPE with ``<|endoftext|>`` as its only special token (id 0, the EOS)
    and save it as a transformers fast tokenizer in ``output_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 257 + 1:
        raise LoopDataError(f"vocab_size {vocab_size} too small; byte-level BPE needs at least 258 "
                            "(256 bytes + EOS + one merge)")
    tok = Tokenizer(models.BPE())
    # No prefix space: decode(encode(text)) must reproduce the document byte for byte.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    count = 0

    def counted() -> Iterable[str]:
        nonlocal count
        for text in texts:
            count += 1
            yield text

    tok.train_from_iterator(counted(), trainer=trainer)
    if count == 0:
        raise LoopDataError("no documents to train the tokenizer on; expected a non-empty corpus")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out
