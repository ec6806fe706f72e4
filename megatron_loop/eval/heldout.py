"""Held-out loss and perplexity at the model's loop count r on an indexed validation prefix.

The prefix is packed exactly as in training (``data.packed.PackedDataset``: seed-shuffled
documents, non-overlapping ``seq_length`` windows, App. C.1); the loss of a window is the
mean next-token cross-entropy over its ``seq_length - 1`` predictions; the reported loss is
the mean over windows and perplexity = exp(loss); ``stderr`` is the standard error of that mean
over windows (sample standard deviation / sqrt(windows)).
"""

from __future__ import annotations

import math

import torch


def heldout_loss(model, prefix: str, seq_length: int, max_sequences: int | None = None,
                 batch_size: int = 4, seed: int = 1234, loops: list[int] | None = None) -> dict:
    """``{"loss", "stderr", "perplexity", "sequences"}`` of an HF causal LM at its configured loop count
    (loss in nats per predicted token). With ``loops``: ``{r: that dict}`` for every r from one forward
    per batch (the export's ``loop_readouts``, bitwise the logits of a forward at each r; only where
    the trajectory does not depend on r: ``one_pass.sweep_passes``)."""
    # here, not at the top: megatron-core (behind PackedDataset) is paid only by sweeps that
    # evaluate a held-out prefix, not by lm-eval-only sweeps of an HF export
    from megatron_loop.data.packed import PackedDataset

    dataset = PackedDataset(prefix, seq_length=seq_length, seed=seed)
    n = len(dataset) if max_sequences is None else min(len(dataset), max_sequences)
    device = next(model.parameters()).device
    windows: dict[int | None, list[float]] = {r: [] for r in (loops or [None])}
    with torch.no_grad():
        for start in range(0, n, batch_size):
            tokens = torch.stack([dataset[i]["tokens"] for i in range(start, min(n, start + batch_size))]).to(device)
            logits = (model.loop_readouts(tokens, loops) if loops
                      else {None: model(tokens, use_cache=False).logits})
            for r, by_r in logits.items():
                losses = torch.nn.functional.cross_entropy(by_r[:, :-1].float().transpose(1, 2), tokens[:, 1:],
                                                           reduction="none")
                windows[r] += losses.mean(dim=1).tolist()
    stats = {r: _mean_loss(values) for r, values in windows.items()}
    return stats if loops else stats[None]


def _mean_loss(windows: list[float]) -> dict[str, float]:
    count = len(windows)
    loss = sum(windows) / count
    stderr = (math.sqrt(sum((w - loss) ** 2 for w in windows) / (count - 1) / count) if count > 1 else None)
    return {"loss": loss, "stderr": stderr, "perplexity": math.exp(loss), "sequences": count}
