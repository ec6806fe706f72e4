"""Building a training run, once: config -> plan -> process groups -> loaders -> model -> engine -> restore.

The trainer's boundary (torchtitan's ``Trainer.__init__``, OLMo-core's ``TrainModule`` setup): the
checks that need no process group run first (one clear error, nothing written), then the world and
megatron-core's groups (:mod:`megatron_loop.parallel.bootstrap`), the source of a weights-only start
checked (``train.init_from``, :mod:`megatron_loop.training.init_from`), the run lock, the resume decision
(rank 0 decides, every rank follows: :mod:`megatron_loop.training.checkpoint`), the loaders, the model
built plain (:func:`megatron_loop.model.build_model`; a weights-only start loads its weights here) and
prepared for training by the one preparation stage (:func:`megatron_loop.parallel.parallelize.parallelize`), the DeepSpeed engine
(:func:`megatron_loop.optim.build_engine`) and the restored state. The step and the loop that use
what this builds are :mod:`megatron_loop.training.loop`.
"""

from __future__ import annotations

import random
import shutil
import sys
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from megatron_loop.checkpoint.folders import complete_tags
from megatron_loop.checkpoint.state import TrainState
from megatron_loop.config import Config
from megatron_loop.config.deepspeed import DeepSpeedSettings
from megatron_loop.config.launch_env import launch_world_size
from megatron_loop.data.loaders import SupervisedBatches, build_train_valid_loaders
from megatron_loop.measure.peak_flops import peak_flops_per_device
from megatron_loop.model import build_model
from megatron_loop.optim import build_engine
from megatron_loop.optim.engine import describe_precision
from megatron_loop.parallel.bootstrap import init_model_parallel
from megatron_loop.model.placement import current_placement
from megatron_loop.optim.memory import pending_training_memory
from megatron_loop.parallel.parallelize import count_pending_memory, parallelize
from megatron_loop.plan import accumulation_steps, total_train_steps
from megatron_loop.training import (agreement, checkpoint, distributed, divergence, init_from, memory_plan,
                                    preflight, signals)
from megatron_loop.training.banner import start_record, training_statement, write_resolved_config
from megatron_loop.training.distributed import DistInfo
from megatron_loop.training.lock import RunLock
from megatron_loop.training.metrics import MetricsLogger
from megatron_loop.training.resume import Hyperparameters, ResumeDecision, apply_decision, decide_resume, run_settings
from megatron_loop.training.signals import StopController
from megatron_loop.training.step import TrainStep


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
    peak_flops: float | None  # None: no known peak (CPU without logging.peak_tflops), no MFU
    root: Path
    step: TrainStep | None = None  # what a training step computes (training/step.py)
    settings: dict | None = None  # what each checkpoint's manifest records (resume.run_settings)
    lock: RunLock | None = None  # rank 0's hold on train.output_dir
    last_tokens: object = None  # the last training micro-batch (a non-finite stop checks the weights on it)


def seed_everything(seed: int) -> None:
    """App. C.2: seed 42 everywhere (model init is identical on every rank)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


def data_loaders(cfg: Config, total_steps: int):
    """This rank's training and validation loaders, sharded by its data-parallel rank: the
    tensor-parallel ranks of one data-parallel group read the same micro-batches. No periodic
    validation (``eval_interval`` 0): the validation set is not even opened, so one smaller than a
    micro-batch cannot stop the run."""
    t, placement = cfg.train, current_placement()
    return build_train_valid_loaders(
        cfg.data, seq_length=t.seq_length, global_batch_size=t.global_batch_size,
        micro_batch_size=t.micro_batch_size, validation=bool(t.eval_interval), dp_rank=placement.dp_rank,
        dp_size=placement.dp_size, seed=t.seed, vocab_size=cfg.model.vocab_size,
        train_samples=total_steps * t.global_batch_size)


def build_run(cfg: Config, resume: str | None,
              stopper: StopController | None = None) -> tuple[Run, TrainState, MetricsLogger]:
    """Everything the loop needs, with the state to continue from and the metrics logger."""
    t = cfg.train
    # Cheap checks first, before the heavy imports and the process group (fast, clear errors). The
    # data-parallel size is the world over the tensor-parallel size (config/parallel.py); the batch
    # arithmetic and the DeepSpeed JSON are checked against it, and the groups built below must agree.
    data_parallel = cfg.parallel.check_world(launch_world_size(), t.seq_length)
    accumulation = accumulation_steps(cfg, data_parallel)
    preflight.check_eval_loops(cfg)
    preflight.check_host(cfg)
    preflight.check_vocabulary(cfg)
    out = Path(t.output_dir)
    preflight.check_output_dir(out, t.resume or resume is not None)
    # the DeepSpeed JSON read and resolved once for this start; the checks, the statement and the engine get it
    deepspeed = DeepSpeedSettings.of_run(cfg, accumulation, data_parallel, cuda=torch.cuda.is_available())
    preflight.check_input_files(cfg, deepspeed)
    preflight.check_data_epochs(cfg)
    total_steps = total_train_steps(cfg)
    memory_plan.check_run_memory(cfg, deepspeed)  # a step its device cannot hold: refused here

    info = distributed.setup_distributed(t.collective_timeout_s)
    agreement.check_ranks_agree(cfg, deepspeed, info)  # every rank runs rank 0's config, data and tokenizer
    placement = init_model_parallel(cfg.parallel.tensor_model_parallel_size, cfg.parallel.sequence_parallel,
                                     t.collective_timeout_s)
    assert placement.dp_size == data_parallel, (placement, data_parallel)  # the same world, counted twice
    # a weights-only start (train.init_from): its checkpoint checked against this model before anything is written
    resuming = resume is not None or (t.resume and bool(complete_tags(out / preflight.CHECKPOINTS)))
    source = init_from.choose_source(cfg, resuming, info, placement)
    lock = take_output_dir(out, info)  # one run per folder; writable; nothing written before this
    try:
        return _build_locked(cfg, resume, stopper, info, lock, out, deepspeed, accumulation, total_steps, source,
                             placement)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _build_locked(cfg: Config, resume: str | None, stopper: StopController | None, info: DistInfo,
                  lock: RunLock | None, out: Path, deepspeed: DeepSpeedSettings, accumulation: int, total_steps: int,
                  source: init_from.InitSource | None = None, placement=None):
    t = cfg.train
    if info.is_main:  # the model and the plan, stated as --dry-run computes them (training/banner.py)
        # on stderr with the rest of the run's log (step lines, summary); stdout carries data only
        print(training_statement(cfg, deepspeed), file=sys.stderr, flush=True)
    seed_everything(t.seed)

    stage = deepspeed.zero_stage
    root = out / preflight.CHECKPOINTS
    point = checkpoint.choose_resume_point(root, resume, t.resume, info)  # what changed: refused before any work
    cfg, divergence_note = divergence.lr_after_divergence(cfg, root)  # after a stop on non-finite values
    t = cfg.train
    decision = decide_resume(point, cfg, info.world_size, stage) if point else ResumeDecision()

    loaders = data_loaders(cfg, total_steps)
    signals.protect_loader_workers(loaders.train, loaders.valid)  # a group signal must not kill a worker

    set_aside = checkpoint.start_branch(root, point, out, info) if point is not None else None
    load_dir = checkpoint.universal_copy(root, point, info) if decision.universal else None
    if decision.universal:  # DeepSpeed re-partitions a universal checkpoint over this world
        deepspeed = deepspeed.with_universal_load()

    model = build_model(cfg.model, placement)  # plain: the groups above are this run's
    kept = init_from.load_source_weights(model, source) if source is not None else []  # before the engine
    step = TrainStep(t, cfg.model, info.rank)
    step.prepare(model)  # what the objective needs before the optimizer (Ouro's Stage II: the LM frozen)
    compile_note = parallelize(model, stage)
    parts = build_engine(model, t, deepspeed, total_steps=total_steps)
    engine, optimizer = parts.engine, parts.optimizer
    count_pending_memory(model, lambda: pending_training_memory(engine, optimizer))  # auto recomputation's budget

    state = TrainState()
    logger_msgs = [describe_precision(engine)] + ([divergence_note] if divergence_note else [])
    if lock is not None and lock.taken_over:
        logger_msgs.append(lock.takeover_note())
    settings = run_settings(cfg, info.world_size, stage)
    if source is not None:  # the lineage every checkpoint of this run records (manifest)
        settings[init_from.MANIFEST_KEY] = source.record()
        logger_msgs.append(source.describe(kept))
    elif point is not None and (point.manifest or {}).get(init_from.MANIFEST_KEY):
        settings[init_from.MANIFEST_KEY] = point.manifest[init_from.MANIFEST_KEY]
    if point is not None and t.init_from:
        logger_msgs.append(f"train.init_from={t.init_from!r} ignored: resuming this run's own checkpoint "
                           "(a weights-only start applies to a fresh start only)")
    if point is not None:
        fresh = Hyperparameters.of(engine, optimizer)  # the new config's settings, before the load
        state = checkpoint.load_checkpoint(engine, point, info, load_dir=load_dir)
        if load_dir is not None:  # the universal copy has served
            distributed.barrier()
            if info.is_main:
                shutil.rmtree(load_dir, ignore_errors=True)
        schedule_line = apply_decision(engine, optimizer, fresh, decision, t.schedule_on_resume, complete_tags(root))
        logger_msgs += checkpoint.resume_messages(point, decision, set_aside, schedule_line, state, info, resume,
                                                  total_steps)
    loaders.train_sampler.consumed_samples = state.consumed_samples  # exact next sample
    valid_batches = [] if loaders.valid is None else list(islice(loaders.valid, t.eval_batches))

    # a hung worker is an error, and so is a data file changed under the live run (loaders.data_watch)
    batches = SupervisedBatches(loaders.train, cfg.data.worker_timeout_s, loaders.data_watch)
    # MFU where a peak is known (a GPU's published one, or logging.peak_tflops); a CPU's measured matmul
    # rate moves with the machine's load (MFU of 6 % to 90 % for one config), so none is logged there.
    device = torch.device(engine.device)
    peak = (None if device.type == "cpu" and cfg.logging.peak_tflops is None
            else peak_flops_per_device(device, cfg.logging.peak_tflops)[0])
    run = Run(cfg=cfg, info=info, engine=engine, optimizer=optimizer, train_iter=batches,
              valid_batches=valid_batches, accumulation=accumulation, total_steps=total_steps,
              zero_stage=stage, peak_flops=peak, root=root, step=step,
              settings=settings, lock=lock)
    if stopper is not None:
        launchers = distributed.launcher_processes()
        if launchers:
            stopper.add_check(signals.LAUNCHER_GONE, lambda: distributed.launcher_gone(launchers))
        if lock is not None:
            stopper.add_check(signals.OUTPUT_GONE, lambda: not lock.still_ours())
    if info.is_main:  # the resolved config to a file, one line saying where (training/banner.py): written once
        # every check that can refuse the run has passed (a refused start leaves its output folder as it was)
        print(write_resolved_config(cfg, out), file=sys.stderr, flush=True)
    logger = MetricsLogger(cfg, enabled=info.is_main, start_step=state.step, total_steps=total_steps)
    logger_msgs.append(compile_note)  # compiled blocks, or why not (ZeRO-3)
    for msg in logger_msgs:
        logger.message(msg)
    logger.log(start_record(cfg, engine.lr_scheduler, optimizer, state.step, total_steps,  # label, schedule
                            source.record() if source is not None else None))
    logger.data_usage(loaders.train_usage or [], loaders.valid_prefixes if valid_batches else [], len(valid_batches))
    if point is not None:
        logger.log({"event": "resume", "step": state.step, "checkpoint": str(point.path),
                    "skipped": list(point.notes), "set_aside": str(set_aside) if set_aside else None,
                    "universal": decision.universal, "changes": decision.schedule + decision.optimizer + decision.other})
    return run, state, logger
