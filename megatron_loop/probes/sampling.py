"""Probe examples and selection masks (App. C.4 "Execution and sampling").

The first N packed sequences of the validation stream (``PackedDataset``: documents in a
seed-determined order, cut into ``seq_length``-token windows) are read; the model sees
``tokens[:, :-1]`` and position p predicts token p + 1. Exactly M next-token prediction
positions are selected in stream order, so every sequence before the budget boundary is
fully selected and the final one partially (49 x 2,047 positions cover the paper's 100,000).
The sample is a deterministic function of (prefix, seq_length, seed, N, M), hence identical
across configurations and inference depths; :meth:`ProbeSample.fingerprint` lets runs check it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch

from megatron_loop.data.packed import PackedDataset
from megatron_loop.errors import LoopDataError


@dataclass(frozen=True)
class ProbeSample:
    """``tokens`` [N, S] packed windows; ``mask`` [N, S - 1] the selected prediction positions T."""

    tokens: torch.Tensor
    mask: torch.Tensor

    def __post_init__(self) -> None:
        if self.mask.dtype != torch.bool:
            raise LoopDataError(f"probe sample: mask dtype {self.mask.dtype}; expected torch.bool")
        if self.tokens.dim() != 2 or self.mask.shape != (self.tokens.shape[0], self.tokens.shape[1] - 1):
            raise LoopDataError(f"probe sample: tokens {tuple(self.tokens.shape)} and mask "
                                f"{tuple(self.mask.shape)} do not match; expected [N, S] and [N, S-1]")

    @property
    def inputs(self) -> torch.Tensor:
        return self.tokens[:, :-1]

    @property
    def num_positions(self) -> int:
        """|T|."""
        return int(self.mask.sum())

    @property
    def nonempty(self) -> torch.Tensor:
        return self.mask.any(dim=1)

    @property
    def num_sequences(self) -> int:
        """N, the number of nonempty sequences."""
        return int(self.nonempty.sum())

    @property
    def last_positions(self) -> torch.Tensor:
        """p_n, the last selected prediction position of each sequence (-1 when empty)."""
        return last_positions(self.mask)

    def fingerprint(self) -> str:
        """sha256 of the tokens and the mask: equal fingerprints mean identical examples and masks."""
        digest = hashlib.sha256()
        digest.update(self.tokens.to(torch.int64).contiguous().numpy().tobytes())
        digest.update(self.mask.contiguous().numpy().tobytes())
        return digest.hexdigest()

    def chunks(self, size: int):
        """Nonempty sequences in groups of ``size``: (tokens, mask) pairs, for streaming."""
        keep = self.nonempty.nonzero().flatten()
        for start in range(0, len(keep), size):
            rows = keep[start:start + size]
            yield self.tokens[rows], self.mask[rows]


def last_positions(mask: torch.Tensor) -> torch.Tensor:
    """p_n for a mask [N, S - 1]: the last selected position of each row (-1 when empty)."""
    idx = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask, idx, torch.full_like(idx, -1)).max(dim=1).values


def select_positions(num_sequences: int, predictions_per_sequence: int, num_positions: int | None) -> torch.Tensor:
    """Mask [N, S - 1] selecting the first ``num_positions`` prediction positions in stream order
    (all of them when ``None``); the sequence at the budget boundary is partially selected."""
    available = num_sequences * predictions_per_sequence
    if num_positions is None:
        num_positions = available
    if not 1 <= num_positions <= available:
        raise LoopDataError(f"--num-positions {num_positions}: {num_sequences} sequences of "
                            f"{predictions_per_sequence} predictions hold {available}; expected 1..{available}, "
                            "'all' or 'paper' (the paper's 100000, App. C.4, needs e.g. 49 sequences of 2048 tokens)")
    flat = torch.arange(available) < num_positions
    return flat.reshape(num_sequences, predictions_per_sequence)


def packed_windows(prefix: str | os.PathLike, seq_length: int, seed: int = 0) -> int:
    """How many ``seq_length``-token windows the validation stream of ``prefix`` packs into."""
    return len(PackedDataset(prefix, seq_length=seq_length, seed=seed))


def load_probe_sample(prefix: str | os.PathLike, seq_length: int, num_sequences: int,
                      num_positions: int | None, seed: int = 0) -> ProbeSample:
    """The first ``num_sequences`` packed windows of ``prefix`` with exactly ``num_positions``
    selected positions (deterministic given ``seed``)."""
    if num_sequences < 1:
        raise LoopDataError(f"--num-sequences {num_sequences}: expected at least 1")
    dataset = PackedDataset(prefix, seq_length=seq_length, seed=seed)
    if len(dataset) < num_sequences:
        raise LoopDataError(f"indexed dataset '{prefix}': {len(dataset)} packed sequences of {seq_length} "
                            f"tokens; expected at least --num-sequences {num_sequences}")
    tokens = torch.stack([dataset[i]["tokens"] for i in range(num_sequences)])
    return ProbeSample(tokens=tokens, mask=select_positions(num_sequences, seq_length - 1, num_positions))
