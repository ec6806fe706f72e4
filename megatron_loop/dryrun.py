"""``pretrain_loop.py --dry-run``: what a config would train, checked and counted in well under a second.

The numbers come from :mod:`megatron_loop.plan` (token budget, steps, WSD split, accumulation,
parameter count, data epochs), the same functions training uses, so a dry run imports neither
torch nor megatron-core: it reads the YAML, checks the files the run would open (DeepSpeed JSON,
data prefixes, tokenizer) with the same preflight checks as training, and prints one JSON line.
"""

from __future__ import annotations

import os
import sys

from megatron_loop.config import Config
from megatron_loop.errors import LoopConfigError
from megatron_loop.parallel.plan import tensor_parallel_plan
from megatron_loop.plan import accumulation_steps, check_train_steps, count_parameters, data_epochs, training_plan
from megatron_loop.training import preflight

# Repeating data up to about four epochs costs almost nothing against fresh data; beyond that the
# returns fall quickly (Muennighoff et al., 2023, "Scaling Data-Constrained Language Models").
DATA_REUSE_WARN_EPOCHS = 4.0


def data_reuse_warnings(epochs: dict[str, float]) -> list[str]:
    return [f"warning: data.train_prefixes[{i}] '{prefix}': the plan reads {e:,.1f} epochs of it; beyond about "
            f"{DATA_REUSE_WARN_EPOCHS:g} epochs repeated data stops helping (Muennighoff et al., 2023): train on "
            "more data, or set train.train_tokens / train.max_steps lower"
            for i, (prefix, e) in enumerate(epochs.items()) if e > DATA_REUSE_WARN_EPOCHS]


def default_data_parallel_size() -> int:
    """The world size a launcher exported (torchrun/deepspeed ``WORLD_SIZE``, SLURM ``SLURM_NTASKS``), else 1."""
    return int(os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or 1)


def dry_run_report(cfg: Config, data_parallel_size: int | None = None) -> dict:
    """The JSON line of ``--dry-run`` after the checks training runs before it writes anything.

    Raises :class:`~megatron_loop.errors.LoopConfigError` / ``LoopDataError`` (one ``error:``
    line, exit 2) for a batch that does not divide, a missing DeepSpeed JSON or one that contradicts
    the YAML (:func:`megatron_loop.config.deepspeed.check_deepspeed_config`), a missing data
    prefix or tokenizer, a tokenizer larger than the model's vocabulary, or a budget below one
    step. Prints a ``warning:`` line on stderr per train prefix read more than
    :data:`DATA_REUSE_WARN_EPOCHS` times; ``data_epochs`` and ``eval_loops`` are in the JSON.
    """
    # the launcher's world holds tensor-parallel x data-parallel ranks (config/parallel.py)
    world = (default_data_parallel_size() if data_parallel_size is None
             else data_parallel_size * cfg.parallel.tensor_model_parallel_size)
    dp = cfg.parallel.check_world(world, cfg.train.seq_length)
    if dp < 1:
        raise LoopConfigError(f"--data-parallel-size={dp}: expected a positive number of data-parallel ranks")
    accumulation = accumulation_steps(cfg, dp)
    preflight.check_eval_loops(cfg)
    files = preflight.check_input_files(cfg, accumulation, dp)
    preflight.check_vocabulary(cfg)
    plan = training_plan(cfg)
    check_train_steps(cfg, plan["train_steps"])
    epochs = data_epochs(cfg, plan["train_steps"])
    for line in data_reuse_warnings(epochs):
        print(line, file=sys.stderr)
    params, backbone = count_parameters(cfg.model)
    return dict(
        layout=cfg.model.layout,
        params=params,
        params_backbone=backbone,
        physical_depth=cfg.model.physical_depth,
        effective_depth=cfg.model.effective_depth(),
        **plan,
        global_batch=cfg.train.global_batch_size,
        micro_batch=cfg.train.micro_batch_size,
        data_parallel_size=dp,
        **tensor_parallel_plan(cfg, params, dp),
        accumulation=accumulation,
        seq_length=cfg.train.seq_length,
        **files,
        data_epochs=epochs,
        eval_interval=cfg.train.eval_interval,
        eval_loops=list(cfg.train.eval_loops or []) if cfg.train.eval_interval else [],
    )
