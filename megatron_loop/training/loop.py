"""The training loop (App. C.2 "Training"): steps, validation, checkpoints, the stop and NaN policies.

One step = one global batch: ``accumulation`` micro-batches per rank, each run through exactly
K loops with full backpropagation (the paper; ``train.loop_sampling`` / ``train.backprop_loops``
draw the step's loop count and truncate backpropagation), ``engine.backward`` divides
the loss by the accumulation steps, and the engine reduces, clips the RAW gradients to
``grad_clip`` and steps Muon + AdamW and the WSD schedule at the accumulation boundary
(:func:`megatron_loop.optim.build_engine`). After each step the loop logs, validates, saves,
and asks every rank whether to stop (signal, wall time, ``exit_interval``). What the loop runs on
is built once, before it starts, by :func:`megatron_loop.training.setup.build_run`.

Non-finite loss or gradient norm: DeepSpeed's ZeRO optimizers already refuse
an update whose global gradient norm is not finite (zeroing the gradients, not stepping the
schedule); the loop counts such steps and, by ``train.nan_policy``, skips up to
``max_consecutive_nonfinite`` in a row (``skip``) or stops at once (``stop``), saving the last
good state: the weights before the bad batch, with the data position before it, when they are
still good, else nothing, naming the newest good checkpoint (:mod:`megatron_loop.training.divergence`).
Saves during a streak of skipped updates leave retention alone, so the newest checkpoint from
before the streak is never removed.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time

import torch

from megatron_loop.checkpoint.folders import read_latest
from megatron_loop.checkpoint.state import TrainState
from megatron_loop.config import Config
from megatron_loop.data.loaders import LoaderFailure, end_loader_workers, loader_failure
from megatron_loop.errors import LoopDataError, os_error_line
from megatron_loop.flops import mfu
from megatron_loop.model.recompute import new_loop_schedules
from megatron_loop.training import checkpoint, distributed, divergence, signals
from megatron_loop.training.dynamics import loop_dynamics
from megatron_loop.training.metrics import MetricsLogger, memory_stats
from megatron_loop.training.setup import Run, build_run
from megatron_loop.training.signals import StopController
from megatron_loop.training.step import TrainStep

EXIT_NONFINITE = 3
EXIT_FAILED = 1


class NonFiniteStop(RuntimeError):
    """Training stopped on non-finite values (the last good state is checkpointed)."""


class CollectiveFailure(RuntimeError):
    """A collective timed out or lost a peer (train.collective_timeout_s); nothing more to save."""


# ----------------------------------------------------------------------------- steps


def train_step(run: Run, k: int | list[int] | None = None,
               step: int = 0) -> tuple[float, float, dict[str, float | None], bool]:
    """One global batch: (mean loss over ranks and micro-batches, raw grad norm, lr per group, applied).

    ``k``: the loop count of each micro-batch (``run.step.step_loops``), or one for all of them (default K); ``step``
    (0-based) is the optimizer step. What each micro-batch's forward computes -- the grid of a sampled r,
    truncated backpropagation, Huginn's noise seed, LoopFormer's short trajectory, Ouro's objective -- is
    :class:`~megatron_loop.training.step.TrainStep`'s: this loop knows no design.
    """
    engine, k = run.engine, run.cfg.model.train_loops if k is None else k
    loops = k if isinstance(k, list) else [k] * run.accumulation
    lrs = {f"lr_{g.get('name', i)}": g["lr"] for i, g in enumerate(run.optimizer.param_groups)}
    losses = []
    for micro in range(run.accumulation):
        # pinned by the loader on CUDA (data/loaders.py): the copy is queued, the host does not wait
        tokens = next(run.train_iter)["tokens"].to(engine.device, non_blocking=True)
        run.last_tokens = tokens  # what a non-finite stop checks the weights on without validation data
        loss = engine(tokens, labels=tokens, options=run.step.options(loops[micro], step, micro)).loss
        engine.backward(loss)  # divides by the accumulation steps (App. C.2)
        engine.step()  # optimizer + schedule only at the accumulation boundary
        losses.append(loss.detach().float())
    local = torch.stack(losses).mean().item()
    loss = distributed.all_reduce_mean([local])[0] if run.info.world_size > 1 else local
    grad_norm = _as_float(engine.get_global_grad_norm())
    return loss, grad_norm, lrs, bool(engine.was_step_applied())


@torch.no_grad()
def evaluate(run: Run) -> dict[str, float]:
    """Validation loss on the held-out prefix at each r of ``train.eval_loops``."""
    if not run.valid_batches:
        return {}
    engine = run.engine
    engine.eval()
    result = {}
    for r in run.cfg.train.eval_loops:
        losses = [engine(b["tokens"].to(engine.device), labels=b["tokens"].to(engine.device),
                         options=TrainStep.validation(r)).loss.float().item() for b in run.valid_batches]
        result[f"val_loss_r{r}"] = distributed.all_reduce_mean([sum(losses) / len(losses)])[0]
    engine.train()
    return result


def _as_float(x) -> float:
    return float(x.item() if torch.is_tensor(x) else x) if x is not None else float("nan")


def _save(run: Run, state: TrainState, logger: MetricsLogger) -> str:
    # during a streak of skipped updates retention waits: the newest checkpoint from before it stays
    tag = checkpoint.save_checkpoint(run.engine, run.root, state, run.cfg, run.info, run.settings,
                                     retention=state.consecutive_nonfinite == 0)
    logger.log({"event": "checkpoint", "step": state.step, "tag": tag, "path": str(run.root / tag)})
    return tag


def _log_step(run: Run, state: TrainState, logger: MetricsLogger, loss: float, grad_norm: float,
              lrs: dict, applied: bool, step_s: float, loops: list[int] | int | None = None) -> None:
    t = run.cfg.train
    loops = [run.cfg.model.train_loops] if loops is None else loops if isinstance(loops, list) else [loops]
    # one depth per micro-batch (Huginn's draw): the step's work is the mean of its micro-batches'
    mean_loops = loops[0] if len(set(loops)) == 1 else sum(loops) / len(loops)
    tokens_per_s = t.global_batch_size * t.seq_length / step_s
    logger.log({
        "event": "train", "step": state.step, "consumed_samples": state.consumed_samples,
        "tokens": state.consumed_samples * t.seq_length, "loss": loss, "grad_norm": grad_norm,
        "lr_muon": lrs.get("lr_muon"), "lr_adamw": lrs.get("lr_adamw"), "tokens_per_s": tokens_per_s,
        # MFU per device over the executed work of this step: forward of its `loops` loops, backward
        # of the graphed ones (megatron_loop/flops.py); null where no peak is known (training/setup.py)
        "mfu": None if run.peak_flops is None else sum(
            mfu(tokens_per_s / run.info.world_size, run.cfg.model, t.seq_length, run.peak_flops, k, t.backprop_loops)
            for k in loops) / len(loops),
        "step_time_s": step_s, **memory_stats(), "update_applied": applied,
        "skipped_updates": state.skipped_updates, "train_loops": mean_loops, "micro_batch_loops": loops})


def _on_nonfinite(run: Run, state: TrainState, before: TrainState, logger: MetricsLogger, loss: float,
                  grad_norm: float, applied: bool) -> None:
    """Log the bad step with its batch; stop (raising :class:`NonFiniteStop`) as the policy says."""
    t = run.cfg.train
    first = before.consumed_samples
    logger.log({"event": "nonfinite", "step": state.step, "batch_index": before.step,
                "samples": [first, first + t.global_batch_size], "loss": loss, "grad_norm": grad_norm,
                "update_applied": applied, "consecutive": state.consecutive_nonfinite, "policy": t.nan_policy})
    logger.message(f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at step {state.step} "
                   f"(global batch {before.step}, samples {first}...{first + t.global_batch_size - 1}); "
                   f"update {'applied' if applied else 'skipped'}")
    if t.nan_policy == "skip" and state.consecutive_nonfinite <= t.max_consecutive_nonfinite:
        return
    why = ("train.nan_policy=stop" if t.nan_policy == "stop" else
           f"more than train.max_consecutive_nonfinite={t.max_consecutive_nonfinite} in a row")
    # The update was refused, so the weights are those from before this batch: saved when they are still
    # good on a held-out batch (a bad batch); else an earlier update blew them up (training/divergence.py)
    probe = run.valid_batches[0]["tokens"] if run.valid_batches else run.last_tokens
    tag = good = None
    if not applied and divergence.weights_still_good(run, probe):
        tag = good = _save(run, before, logger)
        saved = f"last good state saved as {run.root / tag}"
    else:
        first = state.step - state.consecutive_nonfinite + 1  # the streak's first step: its weights came from
        from_step = first - 1 if not applied else state.step  # the update before it (or this applied one)
        aside, good = divergence.set_aside_diverged(run.root, from_step, run.info)
        saved = (f"the weights had diverged before it (non-finite on another batch too): nothing saved"
                 + (f", the checkpoints from step {from_step} on set aside in {aside}" if aside else "")
                 + (f"; the newest good checkpoint is {run.root / good}" if good else
                    "; no checkpoint from before the divergence (the next start begins afresh)"))
    divergence.record_stop(run.root, state.step, tag, good, run.info)
    raise NonFiniteStop(f"non-finite loss/gradient norm at step {state.step} ({why}); {saved}")


def train(cfg: Config, resume: str | None = None) -> int:
    """Run (or resume) training; returns the process exit code."""
    start = time.monotonic()
    t = cfg.train
    # Before anything forks (DataLoader workers): a signal during startup is not lost either.
    stopper = StopController(t.wall_time_limit_s, start).install(sigint=bool(distributed.launcher_processes()))
    run = logger = state = None
    try:
        run, state, logger = build_run(cfg, resume, stopper)
        saved_at = state.step if state.step > 0 else -1
        while state.step < run.total_steps:
            step_start = time.perf_counter()
            before = TrainState(**vars(state))
            loops = run.step.step_loops(state.step, run.accumulation)  # from (seed, step, micro): every rank's
            loss, grad_norm, lrs, applied = train_step(run, loops, state.step)
            step_s = time.perf_counter() - step_start
            for note in new_loop_schedules(run.engine.module):  # auto: each new schedule and its assumptions
                logger.message(note)
            state.step += 1
            state.consumed_samples += t.global_batch_size
            nonfinite = not (math.isfinite(loss) and math.isfinite(grad_norm))
            state.skipped_updates += int(nonfinite)
            state.consecutive_nonfinite = state.consecutive_nonfinite + 1 if nonfinite else 0
            last = state.step == run.total_steps
            if nonfinite or last or state.step % t.log_interval == 0:
                _log_step(run, state, logger, loss, grad_norm, lrs, applied, step_s, loops)
            if nonfinite:
                _on_nonfinite(run, state, before, logger, loss, grad_norm, applied)
            if run.valid_batches and t.eval_interval and (last or state.step % t.eval_interval == 0):
                logger.log({"event": "eval", "step": state.step, **evaluate(run)})
            every = cfg.logging.dynamics_interval
            if run.valid_batches and every and state.step % every == 0:  # the recurrence, not only the loss
                tokens = run.valid_batches[0]["tokens"].to(run.engine.device)
                logger.log({"event": "dynamics", "step": state.step, **loop_dynamics(run.engine, run.engine.module, tokens)})
            reason = stopper.poll(step_s)  # collective: every rank agrees
            if reason in signals.ERROR_REASONS:
                raise LoopDataError(
                    f"train.output_dir={t.output_dir!r}: {reason} during the run (deleted, moved or unmounted) "
                    f"after step {state.step}; stopped without saving (a save would recreate the folder elsewhere)")
            if reason is None and t.exit_interval and state.step % t.exit_interval == 0:
                reason = f"train.exit_interval={t.exit_interval}"
            if (last and t.save_final) or reason or state.step % t.save_interval == 0:
                _save(run, state, logger)
                saved_at = state.step
            if reason:
                logger.log({"event": "stop", "step": state.step, "reason": reason})
                logger.message(f"stopping after step {state.step} ({reason}); checkpoint saved in {run.root}")
                logger.summary(state.step, state.consumed_samples, time.monotonic() - start, reason)
                return 0
        if saved_at != state.step and t.save_final:
            _save(run, state, logger)
        logger.summary(state.step, state.consumed_samples, time.monotonic() - start)
        return 0
    except RuntimeError as e:
        if isinstance(e, NonFiniteStop):
            raise
        if (why := loader_failure(e, cfg.data.num_workers)) is not None:
            raise LoaderFailure(f"{why}{_where(run, state)}") from None
        why = distributed.collective_failure(e, t.collective_timeout_s, started=run is not None)
        if why is None:
            raise
        raise CollectiveFailure(f"{why}{_where(run, state)}") from None
    except OSError as e:  # e.g. metrics.jsonl on a full disk: the file and the condition, one line (no file
        # named: the condition alone, not train.output_dir, which a full /dev/shm was blamed as before)
        raise LoopDataError(f"{os_error_line(e)}{_where(run, state)}") from None
    finally:
        # Cleanup first, with the stop handlers still installed: a launcher's SIGTERM to the
        # surviving ranks (torchrun ends them when one rank fails) then only sets a flag and
        # cannot kill the process between the error and the lock's release.
        try:
            _release(run, logger, failed=sys.exc_info()[0] is not None)
        finally:
            stopper.uninstall()


def _release(run: Run | None, logger: MetricsLogger | None, failed: bool) -> None:
    """The end of :func:`train`. On an error the DataLoader workers are ended first (they ignore
    stop signals, so Python's exit would wait for them forever), and closing the metrics sinks
    may not raise: a second error (metrics.jsonl on a full disk fails again as it is closed)
    would mask the first."""
    if failed:
        end_loader_workers()
    if logger is not None:
        with contextlib.suppress(Exception) if failed else contextlib.nullcontext():
            logger.close()
    if run is not None and run.lock is not None:
        run.lock.release()


def _where(run: Run | None, state: TrainState | None) -> str:
    if run is None or state is None:
        return ""
    try:
        latest = read_latest(run.root) if run.root.is_dir() else None
    except LoopDataError:
        latest = "unreadable"
    return f" (after step {state.step}; the latest checkpoint is {latest or 'none'})"
