"""Tokenizers: loading a hub/local fast tokenizer (App. C.1) and training a small local BPE.

The paper uses the Llama-3.1-8B and Qwen3-0.6B tokenizers; tests and the quickstart use a
byte-level BPE trained here on the generated corpus (no download), saved as a transformers
fast-tokenizer folder that ``AutoTokenizer.from_pretrained(folder)`` loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from megatron_loop.errors import LoopDataError

EOS_TOKEN = "<|endoftext|>"


def check_tokenizer_location(name_or_dir: str, source: str | None = None) -> None:
    """Refuses, before any slow work, a tokenizer that is neither an existing path nor a possible
    hub id (``huggingface_hub``'s own repo-id rule decides): a mistyped folder gets "no such
    folder" rather than the hub client's "Repo id must be in the form ...". ``source`` is how the
    error names the value (default ``--tokenizer NAME``; a config file and key for a run config)."""
    source = source or f"--tokenizer {name_or_dir}"
    if Path(name_or_dir).expanduser().exists():
        return
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(str(name_or_dir))
    except HFValidationError:
        raise LoopDataError(f"{source}: no such folder; expected a tokenizer folder saved with save_pretrained "
                            "(or a hub name such as meta-llama/Llama-3.1-8B)") from None


def open_tokenizer(name_or_dir: str, source: str | None = None):
    """``AutoTokenizer.from_pretrained(name_or_dir)`` with one-line errors naming ``source`` (see
    :func:`check_tokenizer_location`), ready to be saved into an export."""
    from transformers import AutoTokenizer

    source = source or f"--tokenizer {name_or_dir}"
    check_tokenizer_location(name_or_dir, source)
    path = Path(name_or_dir).expanduser()
    if path.is_file():  # transformers would read a file name as a hub id ("Repo id must be in the form ...")
        if path.name != "tokenizer.json" or not (path.parent / "tokenizer_config.json").is_file():
            raise LoopDataError(f"{source}: a file, not a tokenizer folder; expected a folder saved with "
                                "save_pretrained (tokenizer.json and tokenizer_config.json) or a hub name")
        name_or_dir = str(path.parent)  # its folder: the same tokenizer, with its settings (EOS, padding)
    try:
        # trust_remote_code=False: the tokenizers used here are plain fast tokenizers, and a folder
        # that is also a LoopLM export (config.json with auto_map) would otherwise make transformers
        # ask on stdin whether to run the model's code.
        tok = AutoTokenizer.from_pretrained(name_or_dir, trust_remote_code=False)
    except Exception as e:  # hub/offline/missing-file errors come in many types
        reason = " ".join(str(e).split()).split(". ")[0]
        where = "" if Path(name_or_dir).expanduser().exists() else "no such folder, and "
        raise LoopDataError(f"{source}: {where}cannot load a tokenizer ({reason}); expected a "
                            "folder saved with save_pretrained or a Hugging Face hub name") from None
    # transformers records how it found the files (is_local, local_files_only) in init_kwargs, and
    # save_pretrained would write them into tokenizer_config.json, pinning every copy to local files.
    for key in ("is_local", "local_files_only"):
        tok.init_kwargs.pop(key, None)
    return tok


def load_tokenizer(name_or_dir: str, eos_token: str | None = None, source: str | None = None):
    """A transformers fast tokenizer with an EOS token (every document ends with EOS).

    ``eos_token`` overrides the tokenizer's own EOS (it must already be in the vocabulary).
    """
    tok = open_tokenizer(name_or_dir, source)
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
                            "set (documents are terminated with EOS, App. C.1), or pass --eos-token")
    return tok


# Largest vocabulary train_bpe_tokenizer trains (--vocab-size of tools/train_tokenizer.py).
MAX_VOCAB_SIZE = 2**20


def train_bpe_tokenizer(texts: Iterable[str], output_dir: str | Path, vocab_size: int = 2048,
                        min_frequency: int = 2) -> Path:
    """Train a byte-level BPE with ``<|endoftext|>`` as its only special token (id 0, the EOS)
    and save it as a transformers fast tokenizer in ``output_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 257 + 1:
        raise LoopDataError(f"vocab_size {vocab_size} too small; byte-level BPE needs at least 258 "
                            "(256 bytes + EOS + one merge)")
    if vocab_size > MAX_VOCAB_SIZE:  # the tokenizers library sizes its tables by it: 10^9 aborted the process
        raise LoopDataError(f"vocab_size {vocab_size:,}: expected at most {MAX_VOCAB_SIZE:,} (2^20; the largest "
                            "released LLM vocabularies have about 262,000 tokens)")
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


def tokenizer_fingerprint(tokenizer: str | None) -> dict | None:
    """The identity of a tokenizer folder: sha256 over its files (names and bytes), so that a
    folder retrained in place is told apart from the one the model was trained with. A hub
    name (no local folder) is recorded by name only."""
    if tokenizer is None:
        return None
    folder = Path(tokenizer)
    if not folder.is_dir():
        return {"name": tokenizer, "sha256": None}
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return {"name": tokenizer, "sha256": digest.hexdigest()}
