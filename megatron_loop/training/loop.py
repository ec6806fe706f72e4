"""The training loop (App. C.2 "Training"): steps, validation, checkpoints, the stop and NaN policies.

One step = one global batch: ``accumulation`` micro-batches per rank, each run through exactly
K loops with full backpropagation (the paper; ``train.loop_sampling`` / ``train.backprop_loops``
draw the step's loop count and truncate backpropagation), ``engine.backward`` divides
the loss by the accumulation steps, and the engine reduces, clips the RAW gradients to
``grad_clip`` and steps Muon + AdamW and the WSD schedule at the accumulation boundary
(:func:`megatron_loop.optim.build_engine`). After each step the loop logs, validates, saves,
and asks every rank whether to stop (signal, wall time, ``exit_interval``).

Non-finite loss or gradient norm: DeepSpeed's ZeRO optimizers already refuse
an update whose global gradient norm is not finite (zeroing the gradients, not stepping the
schedule); the loop counts such steps and, by ``train.nan_policy``, skips up to
``max_consecutive_nonfinite`` in a row (``skip``) or stops at once (``stop``), saving the last
good state: the weights before the bad batch, with the data position before it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from megatron_loop.checkpoint.layout import PARTIAL, read_latest
from megatron_loop.checkpoint.publish import remove_partials
from megatron_loop.checkpoint.selection import SelectedCheckpoint, select_automatic, select_explicit
from megatron_loop.config import Config
from megatron_loop.data.loaders import (LoaderFailure, SupervisedBatches, build_train_valid_loaders, end_loader_workers,
                                        loader_failure)
from megatron_loop.errors import LoopDataError, os_error_text, write_failure
from megatron_loop.flops import H100_BF16_PEAK_FLOPS, mfu
from megatron_loop.model import build_model
from megatron_loop.model.apply import new_checkpoint_plans
from megatron_loop.optim import build_engine as build_optim_engine
from megatron_loop.optim.engine import describe_precision, load_ds_config
from megatron_loop.parallel.state import current_layout, initialize_parallel  # TP groups inside a node, DP across
from megatron_loop.measure.peak_flops import matmul_peak_flops
from megatron_loop.plan import accumulation_steps, total_train_steps
from megatron_loop.training import checkpoint, distributed, preflight, signals
from megatron_loop.checkpoint.state import TrainState
from megatron_loop.training.distributed import DistInfo
from megatron_loop.training.lock import RunLock
from megatron_loop.training.loop_sampling import sample_train_loops
from megatron_loop.training.metrics import METRICS_NAME, MetricsLogger, memory_stats
from megatron_loop.training.resume import Hyperparameters, ResumePlan, apply_plan, plan_resume, run_settings
from megatron_loop.training.signals import StopController
from megatron_loop.checkpoint.universal import to_universal

EXIT_NONFINITE = 3
EXIT_FAILED = 1


class NonFiniteStop(RuntimeError):
    """Training stopped on non-finite values (the last good state is checkpointed)."""


class CollectiveFailure(RuntimeError):
    """A collective timed out or lost a peer (train.collective_timeout_s); nothing more to save."""


@dataclass
class Run:
    """What the loop needs, built once."""

    cfg: Config
    info: DistInfo
    engine: object
    optimizer: torch.optim.Optimizer
    train_iter: object
    valid_batches: list
    accumulation: int
    total_steps: int
    zero_stage: int
    peak_flops: float
    root: Path
    settings: dict | None = None  # what each checkpoint's manifest records (resume.run_settings)
    lock: RunLock | None = None  # rank 0's hold on train.output_dir


def seed_everything(seed: int) -> None:
    """App. C.2: seed 42 everywhere (model init is identical on every rank)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def peak_flops_per_device(cfg: Config) -> float:
    """Denominator of MFU: the configured peak, H100/H200 dense bf16 on GPU, or on CPU the
    measured throughput of an fp32 matmul (CPUs have no published per-core peak to use)."""
    if cfg.logging.peak_tflops is not None:
        return cfg.logging.peak_tflops * 1e12
    if torch.cuda.is_available():
        return H100_BF16_PEAK_FLOPS
    # best of the repetitions: a probe slowed by a busy neighbour must not understate the peak
    return matmul_peak_flops(torch.device("cpu"), torch.float32, size=512, reps=8)


def _as_float(x) -> float:
    return float(x.item() if torch.is_tensor(x) else x) if x is not None else float("nan")


# ----------------------------------------------------------------------------- building


def choose_resume_point(root: Path, resume: str | None, auto: bool, info: DistInfo) -> SelectedCheckpoint | None:
    """``--resume PATH`` (strict) or the checkpoint ``latest`` names under ``root`` (with fallback).

    Rank 0 reads and verifies the manifests, every rank follows its decision (or its error).
    """
    def choose() -> SelectedCheckpoint | None:
        if resume is not None:
            return select_explicit(Path(resume))
        remove_partials(root)
        return select_automatic(root) if auto else None

    return distributed.on_main(info, choose, share=True)


def take_output_dir(out: Path, info: DistInfo) -> RunLock | None:
    """Rank 0 locks ``train.output_dir`` (one run per folder) and checks that it can write there,
    before the model is built; every rank follows its error."""
    def take() -> RunLock:
        lock = RunLock(out).acquire()
        try:
            preflight.check_writable(out)
        except BaseException:
            lock.release()
            raise
        return lock

    return distributed.on_main(info, take)


def start_branch(root: Path, point: SelectedCheckpoint, out: Path, info: DistInfo) -> Path | None:
    """Rank 0 moves checkpoints newer than ``point`` (and their metrics) aside; see checkpoint.set_aside_newer."""
    return distributed.on_main(info, lambda: checkpoint.set_aside_newer(root, point, out / METRICS_NAME), share=True)


def universal_copy(root: Path, point: SelectedCheckpoint, info: DistInfo) -> Path:
    """Rank 0 writes ``point`` in DeepSpeed's universal layout next to it (a ``.partial`` folder:
    removed after loading, and by the next start if the run dies first)."""
    load_dir = root / f"{point.tag}.universal{PARTIAL}"

    def convert() -> Path:
        shutil.rmtree(load_dir, ignore_errors=True)
        try:
            to_universal(point.path, load_dir)
        except OSError as e:
            raise LoopDataError(f"{load_dir}: writing the universal checkpoint failed "
                                f"({write_failure(e, root)})") from None
        return load_dir

    return distributed.on_main(info, convert, share=True)


def build_engine(cfg: Config, ds_config: Path | dict, accumulation: int, total_steps: int):
    """The LoopLM in a DeepSpeed engine with Muon + AdamW and the WSD schedule (App. C.2); the
    optimizer settings are ``cfg.train``'s (a :class:`~megatron_loop.config.OptimizerSettings`)."""
    t = cfg.train
    model = build_model(cfg.model, parallel=cfg.parallel)
    parts = build_optim_engine(model, t, micro_batch_size=t.micro_batch_size, grad_accum=accumulation,
                               total_steps=total_steps, ds_config=ds_config,
                               bf16=None if t.precision == "auto" else t.precision == "bf16")  # auto: the JSON's
    return parts.engine, parts.optimizer


def _zero_stage(ds_config: Path) -> int:
    return int(load_ds_config(ds_config=ds_config).get("zero_optimization", {}).get("stage", 0))


def _resume_messages(point: SelectedCheckpoint, plan: ResumePlan, set_aside: Path | None,
                     schedule_line: str | None, state: TrainState, info: DistInfo, resume: str | None,
                     total_steps: int) -> list[str]:
    msgs = list(point.notes)
    if set_aside is not None:
        msgs.append(f"starting a new branch at {point.tag}: newer checkpoints and their metrics moved to {set_aside}")
    msgs += plan.summary(point.manifest.get("world_size") if point.manifest else None, info.world_size)
    msgs += [schedule_line] if schedule_line else []
    how = "--resume" if resume is not None else "newest complete checkpoint"
    msgs.append(f"resuming from {point.path} (step {state.step}, {state.consumed_samples} samples consumed; {how})")
    if state.step >= total_steps:
        msgs.append(f"nothing left to train: the checkpoint is at step {state.step} and the config asks for "
                    f"{total_steps} steps")
    return msgs


def data_loaders(cfg: Config, total_steps: int):
    """This rank's training and validation loaders, sharded by its data-parallel rank: the
    tensor-parallel ranks of one data-parallel group read the same micro-batches."""
    t, layout = cfg.train, current_layout()
    # No periodic validation (eval_interval 0): the validation set is not even opened, so one
    # smaller than a micro-batch cannot stop the run.
    return build_train_valid_loaders(
        cfg.data, seq_length=t.seq_length, global_batch_size=t.global_batch_size,
        micro_batch_size=t.micro_batch_size, validation=bool(t.eval_interval), dp_rank=layout.dp_rank,
        dp_size=layout.dp_size, seed=t.seed, vocab_size=cfg.model.vocab_size,
        train_samples=total_steps * t.global_batch_size)


def build_run(cfg: Config, resume: str | None,
              stopper: StopController | None = None) -> tuple[Run, TrainState, MetricsLogger]:
    t = cfg.train
    # Cheap checks first, before the heavy imports and the process group (fast, clear errors).
    # Data-parallel size: the world over the tensor-parallel size (config/parallel.py); the batch
    # arithmetic and the DeepSpeed JSON are checked against it.
    data_parallel = cfg.parallel.check_world(int(os.environ.get("WORLD_SIZE", "1")), t.seq_length)
    accumulation = accumulation_steps(cfg, data_parallel)
    preflight.check_eval_loops(cfg)
    preflight.check_vocabulary(cfg)
    out = Path(t.output_dir)
    preflight.check_output_dir(out, t.resume or resume is not None)
    ds_config = Path(preflight.check_input_files(cfg, data_parallel)["deepspeed_config"])  # + data prefixes, tokenizer
    total_steps = total_train_steps(cfg)

    info = distributed.setup_distributed(t.collective_timeout_s)
    layout = initialize_parallel(cfg.parallel.tensor_model_parallel_size, cfg.parallel.sequence_parallel)
    accumulation = accumulation_steps(cfg, layout.dp_size)
    lock = take_output_dir(out, info)  # one run per folder; writable; nothing written before this
    try:
        return _build_locked(cfg, resume, stopper, info, lock, out, ds_config, accumulation, total_steps)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _build_locked(cfg: Config, resume: str | None, stopper: StopController | None, info: DistInfo,
                  lock: RunLock | None, out: Path, ds_config: Path, accumulation: int, total_steps: int):
    t = cfg.train
    if info.is_main:  # the resolved config (YAML + --set overrides + backbone preset + defaults)
        # on stderr with the rest of the run's log (step lines, summary); stdout carries data only
        print(f"resolved config ({cfg.source}):\n{cfg.dumps()}", file=sys.stderr, flush=True)
    seed_everything(t.seed)

    root = out / preflight.CHECKPOINTS
    point = choose_resume_point(root, resume, t.resume, info)  # what changed: refused before any work
    plan = plan_resume(point, cfg, info.world_size, _zero_stage(ds_config)) if point else ResumePlan()

    loaders = data_loaders(cfg, total_steps)
    signals.protect_loader_workers(loaders.train, loaders.valid)  # a group signal must not kill a worker

    set_aside = start_branch(root, point, out, info) if point is not None else None
    load_dir = universal_copy(root, point, info) if plan.universal else None
    ds = ds_config
    if plan.universal:  # DeepSpeed re-partitions a universal checkpoint over this world
        raw = json.loads(Path(ds_config).read_text())
        ds = {**raw, "checkpoint": {**raw.get("checkpoint", {}), "load_universal": True}}
    engine, optimizer = build_engine(cfg, ds, accumulation, total_steps)
    zero_stage = engine.zero_optimization_stage()

    state = TrainState()
    logger_msgs = [describe_precision(engine)]
    if lock is not None and lock.taken_over:
        logger_msgs.append(lock.takeover_note())
    if point is not None:
        fresh = Hyperparameters.of(engine, optimizer)  # the new config's settings, before the load
        state = checkpoint.load_checkpoint(engine, point, info, load_dir=load_dir)
        if load_dir is not None:  # the universal copy has served
            distributed.barrier()
            if info.is_main:
                shutil.rmtree(load_dir, ignore_errors=True)
        schedule_line = apply_plan(engine, optimizer, fresh, plan)
        logger_msgs += _resume_messages(point, plan, set_aside, schedule_line, state, info, resume, total_steps)
    loaders.train_sampler.consumed_samples = state.consumed_samples  # exact next sample
    valid_batches = [] if loaders.valid is None else list(islice(loaders.valid, t.eval_batches))

    batches = SupervisedBatches(loaders.train, cfg.data.worker_timeout_s)  # a hung worker is an error
    run = Run(cfg=cfg, info=info, engine=engine, optimizer=optimizer, train_iter=batches,
              valid_batches=valid_batches, accumulation=accumulation, total_steps=total_steps,
              zero_stage=zero_stage, peak_flops=peak_flops_per_device(cfg), root=root,
              settings=run_settings(cfg, info.world_size, zero_stage), lock=lock)
    if stopper is not None:
        launchers = distributed.launcher_processes()
        if launchers:
            stopper.add_check(signals.LAUNCHER_GONE, lambda: distributed.launcher_gone(launchers))
        if lock is not None:
            stopper.add_check(signals.OUTPUT_GONE, lambda: not lock.still_ours())
    logger = MetricsLogger(cfg, enabled=info.is_main, start_step=state.step, total_steps=total_steps)
    logger_msgs.append(engine.module.compile_note)  # compiled blocks, or why not (ZeRO-3)
    for msg in logger_msgs:
        logger.message(msg)
    logger.data_usage(loaders.train_usage or [], loaders.valid_prefixes if valid_batches else [],
                      len(valid_batches))
    if point is not None:
        logger.log({"event": "resume", "step": state.step, "checkpoint": str(point.path),
                    "skipped": list(point.notes), "set_aside": str(set_aside) if set_aside else None,
                    "universal": plan.universal, "changes": plan.schedule + plan.optimizer + plan.other})
    return run, state, logger


# ----------------------------------------------------------------------------- steps


def train_step(run: Run, k: int | None = None) -> tuple[float, float, dict[str, float | None], bool]:
    """One global batch: (mean loss over ranks and micro-batches, raw grad norm, lr per group, applied).

    ``k``: this step's loop count (``loop_sampling.sample_train_loops``; default K), the same for
    every micro-batch; ``train.backprop_loops`` truncates backpropagation to its last N loops.
    """
    engine, k = run.engine, run.cfg.model.train_loops if k is None else k
    # Only non-default variable-depth settings reach the model: the paper's call is unchanged.
    depth = {} if k == run.cfg.model.train_loops else {"timestep_grid": "rescaled"}  # psi on the grid of k
    if run.cfg.train.backprop_loops is not None:
        depth["backprop_loops"] = run.cfg.train.backprop_loops
    lrs = {f"lr_{g.get('name', i)}": g["lr"] for i, g in enumerate(run.optimizer.param_groups)}
    losses = []
    for _ in range(run.accumulation):
        # pinned by the loader on CUDA (data/loaders.py): the copy is queued, the host does not wait
        tokens = next(run.train_iter)["tokens"].to(engine.device, non_blocking=True)
        loss = engine(tokens, num_loops=k, labels=tokens, compute_logits=False, **depth).loss
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
        losses = [engine(b["tokens"].to(engine.device), num_loops=r, labels=b["tokens"].to(engine.device),
                         compute_logits=False).loss.float().item() for b in run.valid_batches]
        result[f"val_loss_r{r}"] = distributed.all_reduce_mean([sum(losses) / len(losses)])[0]
    engine.train()
    return result


def _save(run: Run, state: TrainState, logger: MetricsLogger) -> str:
    tag = checkpoint.save_checkpoint(run.engine, run.root, state, run.cfg, run.info, run.settings)
    logger.log({"event": "checkpoint", "step": state.step, "tag": tag, "path": str(run.root / tag)})
    return tag


def _log_step(run: Run, state: TrainState, logger: MetricsLogger, loss: float, grad_norm: float,
              lrs: dict, applied: bool, step_s: float, loops: int | None = None) -> None:
    t = run.cfg.train
    loops = run.cfg.model.train_loops if loops is None else loops
    tokens_per_s = t.global_batch_size * t.seq_length / step_s
    logger.log({
        "event": "train", "step": state.step, "consumed_samples": state.consumed_samples,
        "tokens": state.consumed_samples * t.seq_length, "loss": loss, "grad_norm": grad_norm,
        "lr_muon": lrs.get("lr_muon"), "lr_adamw": lrs.get("lr_adamw"), "tokens_per_s": tokens_per_s,
        # MFU per device over the executed work of this step: forward of its `loops` loops, backward
        # of the graphed ones (megatron_loop/flops.py)
        "mfu": mfu(tokens_per_s / run.info.world_size, run.cfg.model, t.seq_length, run.peak_flops, loops,
                   t.backprop_loops),
        "step_time_s": step_s, **memory_stats(), "update_applied": applied,
        "skipped_updates": state.skipped_updates, "train_loops": loops})


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
    # The update was refused, so the weights are those from before this batch: save exactly that.
    tag = _save(run, before, logger) if not applied else None
    why = ("train.nan_policy=stop" if t.nan_policy == "stop" else
           f"more than train.max_consecutive_nonfinite={t.max_consecutive_nonfinite} in a row")
    raise NonFiniteStop(f"non-finite loss/gradient norm at step {state.step} ({why}); "
                        f"last good state saved as {run.root / tag if tag else 'none'}")


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
            loops = sample_train_loops(t, cfg.model.train_loops, state.step)  # from (seed, step): same on every rank
            loss, grad_norm, lrs, applied = train_step(run, loops)
            step_s = time.perf_counter() - step_start
            for note in new_checkpoint_plans(run.engine.module):  # auto: each new plan and its assumptions
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
    except OSError as e:  # e.g. metrics.jsonl on a full disk: the file and the condition, one line
        raise LoopDataError(f"{e.filename or t.output_dir}: {os_error_text(e)}{_where(run, state)}") from None
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
