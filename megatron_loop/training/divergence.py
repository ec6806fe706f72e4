"""What a stop on non-finite values saves, and what the resume after it trains with (``train.nan_policy``).

A non-finite loss or gradient norm at step N means the update of step N was refused (DeepSpeed
skips a non-finite gradient norm), so the weights are those of update N-1. They are the last good
state only if they still work: a bad batch (data) leaves them good, but an update that blew them up
(``train.lr`` far too high) leaves weights whose gradients overflow on every batch (their loss can
stay finite: uniform predictions, ln |V|), and saving them as "the last good state" made an
automatic requeue fail again at once. Before saving, :func:`weights_still_good` runs them forward
and backward on a held-out batch (the run's first validation batch, else the last training
micro-batch): a finite loss and finite gradients, they are saved; else the divergence started with
the update before the streak of non-finite steps, so nothing is saved, and the checkpoints that
hold weights from that update on are set aside (``checkpoints/set_aside/<time>-diverged-at-<tag>``,
nothing deleted) so that ``latest`` names the newest checkpoint from before it. (Weights that a
huge update left finite, with finite gradients, but useless are not told apart from good ones.)

Every such stop is recorded in ``checkpoints/divergence.json``. The resume after it (an automatic
requeue runs the same command) starts from ``latest``, the good state; with
``train.divergence_lr_factor`` it trains at ``train.lr`` x factor^stops (the schedule re-derived for
it, as any lr change on resume: ``training/resume.py``), without it at ``train.lr`` as configured,
and it says which (:func:`lr_after_divergence`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from megatron_loop.atomic import fsync_path, write_atomic
from megatron_loop.checkpoint.folders import LATEST, SET_ASIDE, complete_tags
from megatron_loop.config import Config
from megatron_loop.errors import LoopDataError
from megatron_loop.training import distributed as D

RECORD = "divergence.json"


def weights_still_good(run, tokens) -> bool:
    """Whether the model's current weights give a finite loss and finite gradients on ``tokens``: a
    weight blown up by a huge update can still give a finite, uniform loss (ln |V|) while every
    gradient overflows. Every rank runs it (the answer is the same on every rank). The gradients are
    taken with ``torch.autograd.grad``, which accumulates nothing (DeepSpeed's gradient hooks run on
    accumulation); under ZeRO 3, whose parameters are partitioned outside its own forward, the loss
    alone is checked."""
    import torch

    engine, module = run.engine, run.engine.module
    params = [p for p in module.parameters() if p.requires_grad and not hasattr(p, "ds_id")]
    engine.eval()  # the model has no dropout: eval only marks the forward as not a training step's
    try:
        with torch.enable_grad():
            tokens = tokens.to(engine.device)
            loss = module(tokens, labels=tokens, compute_logits=False).loss.float()
            good = bool(torch.isfinite(loss))
            if good and params:
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                good = all(bool(torch.isfinite(g).all()) for g in grads if g is not None)
    finally:
        engine.train()
    bad = 0.0 if good else 1.0
    return (D.all_reduce_max([bad])[0] if run.info.world_size > 1 else bad) == 0.0


def set_aside_diverged(root: Path, from_step: int, info: D.DistInfo) -> tuple[Path | None, str | None]:
    """Rank 0 moves the checkpoints of step >= ``from_step`` (weights from the update that diverged on) to
    ``set_aside/<time>-diverged-at-global_step<from_step>/`` and points ``latest`` at the newest one
    before them (moved along when there is none); returns (that folder or None, the newest good tag or
    None). Nothing is deleted."""
    from megatron_loop.training.checkpoint import _new_set_aside_folder

    def move() -> tuple[Path | None, str | None]:
        tags = complete_tags(root)
        good = next((tag for step, tag in tags if step < from_step), None)
        bad = [tag for step, tag in tags if step >= from_step]
        if not bad:
            return None, good
        dest = _new_set_aside_folder(root / SET_ASIDE, f"{time.strftime('%Y%m%d-%H%M%S')}-diverged-at-"
                                                       f"global_step{from_step}")
        for tag in bad:
            os.replace(root / tag, dest / tag)
        if good is not None:
            write_atomic(root / LATEST, good, durable=True)
        elif (root / LATEST).exists():  # nothing from before: the next start begins afresh
            os.replace(root / LATEST, dest / LATEST)
        fsync_path(root)
        return dest, good

    return D.on_main(info, move, share=True)


def record_stop(root: Path, step: int, saved: str | None, good: str | None, info: D.DistInfo) -> int:
    """Append this stop to ``checkpoints/divergence.json`` (rank 0); returns the number of stops recorded."""
    def write() -> int:
        stops = read_stops(root)
        stops.append({"step": step, "saved": saved, "resume_from": saved or good,
                      "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(root / RECORD, json.dumps({"stops": stops}, indent=1), durable=True)
        return len(stops)

    return D.on_main(info, write, share=True)


def read_stops(root: Path) -> list[dict]:
    path = root / RECORD
    if not path.is_file():
        return []
    try:
        stops = json.loads(path.read_text())["stops"]
        assert isinstance(stops, list)
        return stops
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise LoopDataError(f"{path}: not a record of stops on non-finite values written by pretrain_loop.py; "
                            "expected {\"stops\": [...]}: move it away to resume at train.lr as configured") from None


def lr_after_divergence(cfg: Config, root: Path) -> tuple[Config, str | None]:
    """The config a resume trains with after recorded stops on non-finite values, and the line that
    says so (None: no stop recorded)."""
    stops = read_stops(root)
    if not stops:
        return cfg, None
    t, last = cfg.train, stops[-1]
    where = f"{len(stops)} stop{'s' if len(stops) > 1 else ''} on non-finite values recorded in {root / RECORD} " \
            f"(the last at step {last['step']}, resuming from {last.get('resume_from') or 'the start'})"
    if t.divergence_lr_factor is None:
        return cfg, f"{where}: training at train.lr={t.lr:g} as configured (set train.divergence_lr_factor to lower it)"
    lr = t.lr * t.divergence_lr_factor ** len(stops)
    note = (f"{where}: training at train.lr={t.lr:g} x train.divergence_lr_factor={t.divergence_lr_factor:g}"
            f"^{len(stops)} = {lr:g}")
    return dataclasses.replace(cfg, train=dataclasses.replace(t, lr=lr)), note
