"""What a run is and what it will do, computed once from the config: the numbers ``--dry-run``
prints as JSON (:func:`run_summary`) and the start-up statement training prints on rank 0
(:func:`startup_statement`), as nanoGPT, Megatron-LM and torchtitan state the model and the plan
before the first step.

The statement is formatted from :func:`run_summary`'s dict, so the console and the dry run cannot
disagree: parameters (:func:`megatron_loop.plan.count_parameters`), the layout ``p+s x K+c`` and
L(K) = p + K s + c (App. C.1), the token budget, steps and WSD split (App. C.2,
:func:`megatron_loop.plan.training_plan`), the batch arithmetic, TP x DP and the precision.
Imports no torch (``--dry-run`` uses it).
"""

from __future__ import annotations

from pathlib import Path

from megatron_loop.atomic import write_atomic
from megatron_loop.config import Config
from megatron_loop.config.deepspeed import DeepSpeedSettings
from megatron_loop.parallel.per_rank import tensor_parallel_figures
from megatron_loop.plan import count_parameters, data_epochs, training_plan


def run_summary(cfg: Config, data_parallel_size: int, accumulation: int, files: dict) -> dict:
    """The dry run's JSON dict: model, plan, batch arithmetic and parallel layout of ``cfg`` on
    ``data_parallel_size`` ranks; ``files`` is what the preflight checks returned (the DeepSpeed
    JSON's ZeRO stage and precision, the data prefixes, the tokenizer)."""
    plan = training_plan(cfg)
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
        data_parallel_size=data_parallel_size,
        **tensor_parallel_figures(cfg, params, data_parallel_size),
        accumulation=accumulation,
        seq_length=cfg.train.seq_length,
        **files,
        data_epochs=data_epochs(cfg, plan["train_steps"]),
        eval_interval=cfg.train.eval_interval,
        eval_loops=list(cfg.train.eval_loops or []) if cfg.train.eval_interval else [],
    )


def _count(n: int) -> str:
    """Parameters as nanoGPT prints them: 1.23M, 456.8K, 1.40B."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def startup_statement(cfg: Config, summary: dict) -> str:
    """Three lines naming the model, the plan and the placement, from :func:`run_summary`'s dict::

        model: LoopLM tiny-llama 1+2x3+1 (L(K) = 8 block applications at K = 3, 4 physical blocks), 1,234,567
            parameters (1.23M; backbone 1,234,000); conditioning: timestep loop_gating, history scalar (window 2)
        plan: 2,457,600 tokens = 300 steps x 8 sequences x 1,024 tokens; WSD 15 warmup / 255 stable / 30 decay steps
        parallel: TP 1 x DP 2 (world 2), global batch 8 = micro 2 x accumulation 2 x DP 2; ZeRO 1, precision bf16
    """
    m, s = cfg.model, summary
    mechanisms = [("initial", m.initial_injection, ""), ("timestep", m.timestep, ""),
                  ("history", m.history_injection, f" (window {m.history_window})")]
    conditioning = ", ".join(f"{key} {value}{extra}" for key, value, extra in mechanisms if value != "none") or "none"
    backbone = f"{m.backbone} " if m.backbone else ""
    model = (f"model: LoopLM {backbone}{s['layout']} (L(K) = {s['effective_depth']} block applications at "
             f"K = {m.train_loops}, {s['physical_depth']} physical blocks), {s['params']:,} parameters "
             f"({_count(s['params'])}; backbone {s['params_backbone']:,}); conditioning: {conditioning}")
    plan = (f"plan: {s['train_tokens']:,} tokens = {s['train_steps']:,} steps x {s['global_batch']:,} sequences x "
            f"{s['seq_length']:,} tokens; WSD {s['warmup_steps']:,} warmup / {s['stable_steps']:,} stable / "
            f"{s['decay_steps']:,} decay steps")
    sp = " + SP" if s.get("sequence_parallel") else ""
    precision = s.get("precision", cfg.train.precision)
    parallel = (f"parallel: {s['parallel_layout']}{sp} (world {s['world_size']}), global batch {s['global_batch']} = "
                f"micro {s['micro_batch']} x accumulation {s['accumulation']} x DP {s['data_parallel_size']}; "
                f"ZeRO {s.get('zero_stage', '?')}, precision {precision}")
    return "\n".join((model, plan, parallel))


def training_statement(cfg: Config, deepspeed: DeepSpeedSettings) -> str:
    """:func:`startup_statement` of a starting run, from the start's DeepSpeed settings (resolved once, with
    the device known: a precision left to ``auto`` on both sides is the engine's, bf16 with CUDA)."""
    return startup_statement(cfg, run_summary(cfg, deepspeed.data_parallel_size, deepspeed.grad_accum,
                                              deepspeed.report()))


RESOLVED_CONFIG = "resolved_config.json"  # in train.output_dir, rewritten at every start and resume


def write_resolved_config(cfg: Config, output_dir: str | Path) -> str:
    """Write the resolved config (YAML + ``--set`` overrides + backbone preset + defaults, as
    ``--print-config`` prints it) into the run folder, whole; returns the one console line that
    says where (the JSON itself is some 150 lines: a file, not the log)."""
    path = write_atomic(Path(output_dir) / RESOLVED_CONFIG, cfg.dumps() + "\n")
    return f"resolved config: {path} ({cfg.source} + --set overrides + backbone preset + defaults)"


def start_record(cfg: Config, scheduler, optimizer, start_step: int, total_steps: int,
                 init_from: dict | None = None) -> dict:
    """The ``start`` event of metrics.jsonl, logged by every start and resume: what the run is (its
    name and label, :mod:`megatron_loop.config.naming`) and the learning-rate schedule it follows
    from ``start_step`` on (peak lr per group and the :class:`~megatron_loop.optim.schedule.WSDMultiplier`
    fields), so ``tools/plot_metrics.py`` draws the lr at every step, warmup included, while the
    ``train`` records sample it every ``train.log_interval`` steps. ``init_from``: where the run's first
    weights came from (a weights-only start, :mod:`megatron_loop.training.init_from`: path, step, run)."""
    from megatron_loop.config.naming import model_conditioning, run_label, run_name

    names = [g.get("name", str(i)) for i, g in enumerate(optimizer.param_groups)]
    return {"event": "start", "step": start_step, "run": run_name(cfg), "label": run_label(cfg),
            "layout": cfg.model.layout, "conditioning": model_conditioning(cfg.model), "total_steps": total_steps,
            "schedule": {"peak_lr": dict(zip(names, scheduler.base_lrs)), **vars(scheduler.lr_lambdas[0])},
            **({"init_from": init_from} if init_from else {})}
