"""The file paths of a config: indexed-dataset prefixes, the validation sibling, and relative paths
made absolute (the run config is read back from other directories)."""

from __future__ import annotations

import os
from pathlib import Path
from megatron_loop.config.deepspeed import locate
from megatron_loop.config.validation import check_prefixes

# ``Config`` in the annotations is sections.Config: sections imports this module (the validation prefix),
# so this one names it without importing it back.

# The validation split tools/preprocess_data.py --validation-documents writes next to train prefix P.
VALID_SUFFIX = "_valid"


def prefix_exists(prefix: str | os.PathLike) -> bool:
    """An indexed dataset prefix P names P.bin / P.idx, not a file of its own."""
    return any(os.path.isfile(f"{prefix}{ext}") for ext in (".bin", ".idx"))


def sibling_valid_prefix(train_prefix: str | os.PathLike) -> str | None:
    """``P_valid`` next to train prefix ``P`` when it exists (``tools/preprocess_data.py
    --validation-documents`` writes it), else None."""
    sibling = f"{train_prefix}{VALID_SUFFIX}"
    return sibling if prefix_exists(sibling) else None


def resolve_paths(cfg: Config, base: str | os.PathLike | None = None) -> Config:
    """Make the existing relative paths of ``cfg`` absolute (in place; returns ``cfg``).

    The run config is saved next to every checkpoint and read back by the tools
    (``tools/convert_to_hf.py`` takes ``data.tokenizer`` from it), which may run from another
    directory. Relative paths are taken from ``base`` (default: the working directory);
    ``train.deepspeed_config`` is found by :func:`megatron_loop.config.deepspeed.locate` (the working
    directory, then the repository's shipped ``deepspeed_configs/``). A path that
    does not exist stays as written, so the check that reports it names what the user wrote; a
    tokenizer that is not a local path is a hub name and stays too.
    """
    base = Path(os.getcwd() if base is None else base)

    def absolute(path: str, exists) -> str:
        p = Path(path).expanduser()
        if p.is_absolute():
            return str(p)
        candidate = os.path.normpath(base / p)
        return candidate if exists(candidate) else path

    d, t = cfg.data, cfg.train
    d.train_prefixes = [absolute(p, prefix_exists) for p in d.train_prefixes]
    if d.valid_prefixes is not None:
        d.valid_prefixes = [absolute(p, prefix_exists) for p in d.valid_prefixes]
    if d.tokenizer:
        d.tokenizer = absolute(d.tokenizer, os.path.exists)
    t.deepspeed_config = locate(t.deepspeed_config, base)
    if t.init_from:  # another run's checkpoint, read again by every resume's config comparison
        t.init_from = absolute(t.init_from, os.path.exists)
    check_prefixes(d, os.path.realpath)  # two spellings of one file (relative/absolute, a symlink)
    return cfg
