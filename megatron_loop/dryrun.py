"""``pretrain_loop.py --dry-run``: what a config would train, checked and counted in well under a second.

The numbers come from :func:`megatron_loop.training.banner.run_summary` (token budget, steps, WSD
split, accumulation, parameter count, data epochs, from :mod:`megatron_loop.plan`), the dict whose
start-up statement training prints, so a dry run imports neither
torch nor megatron-core: it reads the YAML, checks the files the run would open (DeepSpeed JSON,
data prefixes, tokenizer) with the same preflight checks as training, and prints the start-up
statement training would print (:func:`dry_run_text`), or with ``--json`` the numbers as one JSON line.
"""

from __future__ import annotations

import sys

from megatron_loop.config import Config
from megatron_loop.config.deepspeed import DeepSpeedSettings
from megatron_loop.config.launch_env import launch_world_size
from megatron_loop.errors import LoopConfigError
from megatron_loop.plan import accumulation_steps, check_train_steps, training_plan
from megatron_loop.training import preflight
from megatron_loop.training.banner import run_summary, startup_statement
from megatron_loop.training.memory_plan import dry_run_memory

# Repeating data up to about four epochs costs almost nothing against fresh data; beyond that the
# returns fall quickly (Muennighoff et al., 2023, "Scaling Data-Constrained Language Models").
DATA_REUSE_WARN_EPOCHS = 4.0


def data_reuse_warnings(epochs: dict[str, float], max_epochs: float | None = None) -> list[str]:
    """Above ``max_epochs`` (data.max_epochs) the line says that training will refuse the plan."""
    return [f"warning: data.train_prefixes[{i}] '{prefix}': the plan reads {e:,.1f} epochs of it; beyond about "
            f"{DATA_REUSE_WARN_EPOCHS:g} epochs repeated data stops helping (Muennighoff et al., 2023): train on "
            "more data, or set train.train_tokens / train.max_steps lower"
            + (f"; training refuses more than data.max_epochs={max_epochs:g}"
               if max_epochs is not None and e > max_epochs else "")
            for i, (prefix, e) in enumerate(epochs.items()) if e > DATA_REUSE_WARN_EPOCHS]


def default_data_parallel_size() -> int:
    """The world size a launcher exported (torchrun/deepspeed ``WORLD_SIZE``, SLURM ``SLURM_NTASKS``), else 1."""
    return launch_world_size()


def dry_run_report(cfg: Config, data_parallel_size: int | None = None, check_data: bool = True) -> dict:
    """The JSON line of ``--dry-run`` after the checks training runs before it writes anything.

    Raises :class:`~megatron_loop.errors.LoopConfigError` / ``LoopDataError`` (one ``error:``
    line, exit 2) for a batch that does not divide, a missing DeepSpeed JSON or one that contradicts
    the YAML (:class:`megatron_loop.config.deepspeed.DeepSpeedSettings`, read and resolved once), a missing data
    prefix or tokenizer, a tokenizer larger than the model's vocabulary, or a budget below one
    step. Prints a ``warning:`` line on stderr per train prefix read more than
    :data:`DATA_REUSE_WARN_EPOCHS` times; ``data_epochs`` and ``eval_loops`` are in the JSON.
    ``check_data`` False (``--skip-data-check``): the data prefixes and a tokenizer that is not there
    are not checked (a paper config planned before its tokenised data exists); ``data_checked`` in
    the JSON says which.
    """
    # the launcher's world holds tensor-parallel x data-parallel ranks (config/parallel.py)
    world = (default_data_parallel_size() if data_parallel_size is None
             else data_parallel_size * cfg.parallel.tensor_model_parallel_size)
    dp = cfg.parallel.check_world(world, cfg.train.seq_length)
    if dp < 1:
        raise LoopConfigError(f"--data-parallel-size={dp}: expected a positive number of data-parallel ranks")
    accumulation = accumulation_steps(cfg, dp)
    preflight.check_eval_loops(cfg)
    deepspeed = DeepSpeedSettings.of_run(cfg, accumulation, dp)  # no device known: an all-auto precision stays auto
    if check_data:
        files = preflight.check_input_files(cfg, deepspeed)
    else:
        cfg.data.train_blend()  # an empty train list is still an error
        files = {**deepspeed.report(), "train_prefixes": list(cfg.data.train_prefixes),
                 "valid_prefixes": cfg.data.validation_prefixes() if cfg.train.eval_interval else [],
                 "tokenizer": cfg.data.tokenizer}
    files["data_checked"] = check_data
    for line in preflight.check_host(cfg, training=False):
        print(line, file=sys.stderr)
    preflight.check_init_from(cfg)
    preflight.check_vocabulary(cfg)
    check_train_steps(cfg, training_plan(cfg)["train_steps"])
    report = run_summary(cfg, dp, accumulation, files)
    # what a rank holds in a step (weights, gradients, optimizer state, activations); training checks it
    # against the memory it trains in, the dry run warns when this host could not (training/memory_plan.py)
    need, memory_warnings = dry_run_memory(cfg, dp, report["zero_stage"], report["precision"])
    report["memory_per_rank"] = need
    for line in data_reuse_warnings(report["data_epochs"], cfg.data.max_epochs) + memory_warnings:
        print(line, file=sys.stderr)
    return report


def dry_run_text(cfg: Config, report: dict) -> str:
    """What ``--dry-run`` prints for a person (``--json``: the report itself, one line): the start-up
    statement training prints (model, plan, layout), the data each train prefix gives the plan, the
    validation, and what was checked."""
    lines = [startup_statement(cfg, report)]
    lines += [f"data: {prefix}: the plan reads {epochs:,.2f} epochs of it" for prefix, epochs in report["data_epochs"].items()]
    if report["eval_loops"]:
        lines.append(f"validation: every {report['eval_interval']} steps at r = {', '.join(map(str, report['eval_loops']))}"
                     f" on {', '.join(report['valid_prefixes']) or 'no prefix'}")
    else:
        lines.append("validation: off")
    files = [report["deepspeed_config"]]
    if report["data_checked"]:
        files += [f"{p}.bin/.idx" for p in [*report["train_prefixes"], *report["valid_prefixes"]]]
        files += [report["tokenizer"]] if report.get("tokenizer") else []
    lines.append(f"checked: {', '.join(files)}" + ("" if report["data_checked"] else
                                                     " (data and tokenizer not checked: --skip-data-check)"))
    lines.append("nothing written; --json prints these numbers as one JSON line")
    return "\n".join(lines)
