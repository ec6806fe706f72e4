"""The checks of a loaded config: each section's values, then the checks across sections.

Every failure is one :class:`~megatron_loop.errors.LoopConfigError` naming the key, its value and
what was expected (docs/ERRORS.md lists the messages). The section dataclasses call these from
their ``validate`` methods (:mod:`megatron_loop.config.sections`).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from megatron_loop.config.presets import BACKBONES
from megatron_loop.errors import LoopConfigError

# The section types in the annotations (Config, ModelConfig, ...) are config/sections.py's: sections imports
# this module (each section's ``validate``), so this one names them without importing them back.

INITIAL_INJECTIONS = ("none", "scalar", "channel", "residual_channel", "dense")
HISTORY_INJECTIONS = ("none", "scalar", "channel", "dense")
TIMESTEPS = ("none", "loop_gating", "branch_gating", "adaln", "shortcut")  # shortcut: LoopFormer (model/shortcut.py)
TIMESTEP_GRIDS = ("rescaled", "prefix")
RECOMPUTE_MODES = ("none", "per_loop", "selective", "auto", "per_block")  # model.recompute: megatron_loop/model/recompute.py
LOSS_IMPLEMENTATIONS = ("auto", "chunked", "fused")  # megatron_loop/model/loss.py
# The readings of the paper's ambiguous passages, as switches (defaults = the original
# behaviour). Each is documented where it acts and in docs/CONFIG.md.
NOISY_INITIAL_INJECTIONS = ("scalar", "channel", "residual_channel")  # App. E.1 ablation
LOOP_GATING_REFERENCES = ("state", "injected")
BLOCK_NORMS = ("pre", "sandwich", "branch_output")  # model.block_norm (Huginn's sandwich, Ouro's branch-output norms)
INITIAL_STATES = ("prelude", "noise")  # model.initial_state (Huginn, model/initial_state.py)
NOISE_STATE_TP_REFUSAL = ("model.initial_state='noise': expected parallel.tensor_model_parallel_size=1 (the noise "
                          "state is drawn whole on each rank, not split over tensor-parallel ranks)")
OPTIMIZERS = ("muon_adamw", "adamw")
DATA_ORDERS = ("shuffled", "stream")
LOOP_SAMPLINGS = ("fixed", "poisson_lognormal", "uniform")  # train.loop_sampling (training/loop_sampling.py)
LOOP_SAMPLING_UNITS = ("micro_batch", "step")  # train.loop_sampling_per: one draw per micro-batch (Huginn) or step
EXIT_GATES = ("none", "learned")  # model.exit_gate: Ouro's learned exit gate (model/exit_gate.py)
EXIT_GATE_OBJECTIVES = ("none", "entropy_regularized", "adaptive_gate")  # train.exit_gate_objective: Stage I, II
INIT_FROM_MISSING = ("error", "keep_init")  # train.init_from_missing (training/init_from.py)
# model.exit_gate under tensor parallelism (the config check and LoopLM's own)
EXIT_GATE_TP_REFUSAL = ("model.exit_gate='learned': expected parallel.tensor_model_parallel_size=1 (Ouro's "
                        "objective weighs per-token losses, which the vocabulary-parallel head does not return)")
# The string keys with a fixed set of values: "<section>.<key>" -> its choices (the type check names
# them too, when YAML read an unquoted off/no as a boolean).
CHOICES = {
    "model.initial_injection": INITIAL_INJECTIONS, "model.history_injection": HISTORY_INJECTIONS,
    "model.timestep": TIMESTEPS, "model.timestep_grid": TIMESTEP_GRIDS,
    "model.recompute": RECOMPUTE_MODES, "model.loss_implementation": LOSS_IMPLEMENTATIONS,
    "model.loop_gating_reference": LOOP_GATING_REFERENCES, "model.block_norm": BLOCK_NORMS,
    "model.initial_state": INITIAL_STATES, "train.optimizer": OPTIMIZERS,
    "model.exit_gate": EXIT_GATES, "train.exit_gate_objective": EXIT_GATE_OBJECTIVES,
    "train.loop_sampling": LOOP_SAMPLINGS, "train.loop_sampling_per": LOOP_SAMPLING_UNITS,
    "train.precision": ("auto", "bf16", "fp32"),
    "train.nan_policy": ("skip", "stop"), "train.schedule_on_resume": ("continue_decay", "rewarm", "rederive"),
    "train.init_from_missing": INIT_FROM_MISSING,
    "train.muon_scale": ("match_rms_adamw", "original"),
    "data.order": DATA_ORDERS, "logging.wandb_mode": ("auto", "online", "offline", "disabled"),
}
# Largest loop count a config may train or validate at: L(r) = p + r s block applications per
# token, so r is a cost factor; the paper trains K <= 8 and extrapolates to a few K. A bound keeps a
# typo (an extra digit, 10^22) a clear error instead of a run that never finishes a step.
MAX_LOOPS = 1024
# Longest wait a timeout key takes (7 days): beyond it a hung rank would block for longer than
# any job runs, and far beyond it the value overflows the timedelta / thread timeouts it becomes.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# Largest peak learning rate (train.lr): AdamW and Muon (matched to AdamW's update RMS) take steps of about lr
# per weight, so lr = 1 already rewrites a weight of scale 0.02 by 50x its size; 1e10 is a typo.
MAX_LR = 1.0
# Seeds seed numpy's global generator (App. C.2 seed 42), which takes 0 <= seed < 2^32.
MAX_SEED = 2**32 - 1


def _checker(section: Any, prefix: str) -> Callable[[bool, str, str], None]:
    """``need(condition, key, expected)``: raise ``<prefix>.<key>=<value>: expected <expected>`` unless it holds."""
    def need(cond: bool, key: str, expected: str) -> None:
        if not cond:
            raise LoopConfigError(f"{prefix}.{key}={getattr(section, key)!r}: expected {expected}")

    return need


def validate_model(model: ModelConfig, prefix: str = "model") -> None:
    need = _checker(model, prefix)

    if model.backbone is not None and model.backbone not in BACKBONES:
        raise LoopConfigError(
            f"{prefix}.backbone={model.backbone!r}: unknown backbone; expected one of {sorted(BACKBONES)}")
    need(model.prelude_layers >= 0, "prelude_layers", "an integer >= 0")
    need(model.coda_layers >= 0, "coda_layers", "an integer >= 0")
    need(model.core_layers >= 1, "core_layers", "an integer >= 1 (the shared core needs a block)")
    need(model.train_loops >= 1, "train_loops", "an integer >= 1")
    need(model.train_loops <= MAX_LOOPS, "train_loops", f"at most {MAX_LOOPS} (L(K) = p + K s block applications "
         "per token)")
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "head_dim", "vocab_size", "max_position_embeddings"):
        need(getattr(model, key) >= 1, key, "a positive integer")
    need(model.num_attention_heads % model.num_key_value_heads == 0, "num_attention_heads",
         f"a multiple of num_key_value_heads={model.num_key_value_heads} (grouped-query attention)")
    need(model.head_dim % 2 == 0, "head_dim", "an even number (rotary embedding)")
    need(model.rms_norm_eps > 0, "rms_norm_eps", "a positive float")
    need(model.rope_theta > 0, "rope_theta", "a positive float")
    # the std of the normal initialisation (0.02, App. C.1); above 1 every logit saturates at the
    # first step (loss ln V, gradient 0): a typo, not a setting
    need(0 < model.initializer_range <= 1, "initializer_range", "a float in (0, 1] (a standard deviation, 0.02)")
    need(model.initial_injection in INITIAL_INJECTIONS, "initial_injection", f"one of {INITIAL_INJECTIONS}")
    need(model.history_injection in HISTORY_INJECTIONS, "history_injection", f"one of {HISTORY_INJECTIONS}")
    need(model.history_window >= 1, "history_window", "an integer >= 1")
    # history_window sizes the history injection's beta (Eq. history_state_injection); a window
    # set without the injection would be silently unused.
    need(model.history_window == 1 or model.history_injection != "none", "history_window",
         "1 (the default) unless history_injection is set (history_injection='none' reads no past states)")
    need(model.timestep in TIMESTEPS, "timestep", f"one of {TIMESTEPS}")
    need(model.timestep_grid in TIMESTEP_GRIDS, "timestep_grid", f"one of {TIMESTEP_GRIDS}")
    need(model.injection_init_noise >= 0, "injection_init_noise", "a float >= 0 (a standard deviation)")
    need(model.injection_init_noise == 0 or model.initial_injection in NOISY_INITIAL_INJECTIONS,
         "injection_init_noise", f"0 unless initial_injection is one of {NOISY_INITIAL_INJECTIONS} "
         f"(the App. E.1 ablation; initial_injection={model.initial_injection!r})")
    need(model.loop_gating_reference in LOOP_GATING_REFERENCES, "loop_gating_reference",
         f"one of {LOOP_GATING_REFERENCES}")
    need(model.loop_gating_reference == "state" or model.timestep == "loop_gating", "loop_gating_reference",
         f"'state' unless timestep is 'loop_gating' (timestep={model.timestep!r})")
    need(model.block_norm in BLOCK_NORMS, "block_norm", f"one of {BLOCK_NORMS}")
    need(model.initial_state in INITIAL_STATES, "initial_state", f"one of {INITIAL_STATES}")
    need(model.initial_state == "prelude" or model.initial_injection != "none", "initial_state",
         "'prelude' unless an initial-state injection carries the Prelude output into the Core "
         "(Huginn: initial_injection 'dense'; initial_injection='none' would leave it unused)")
    need(model.initial_state_std is None or model.initial_state_std > 0, "initial_state_std",
         "null (Huginn's sqrt(2/5)) or a positive float (a standard deviation)")
    need((model.initial_state_std is None and model.initial_state_seed == 0) or model.initial_state == "noise",
         "initial_state_std" if model.initial_state_std is not None else "initial_state_seed",
         "its default unless initial_state is 'noise'")
    need(0 <= model.initial_state_seed <= MAX_SEED, "initial_state_seed", f"an integer in [0, {MAX_SEED}]")
    need(model.recompute in RECOMPUTE_MODES, "recompute", f"one of {RECOMPUTE_MODES}")
    need(model.recompute_budget_gib is None or (
        model.recompute == "auto" and model.recompute_budget_gib > 0),
        "recompute_budget_gib", "null, or a positive number of GiB with recompute=auto")
    need(model.recompute_selective_cost is None or (
        model.recompute == "auto" and 0 < model.recompute_selective_cost <= 1),
        "recompute_selective_cost",
        "null, or a number in (0, 1] (loop forwards) with recompute=auto")
    need(model.compile in (True, False, "auto"), "compile", "true, false or 'auto' (on with CUDA)")
    need(model.loss_implementation in LOSS_IMPLEMENTATIONS, "loss_implementation",
         f"one of {LOSS_IMPLEMENTATIONS}")
    need(model.exit_gate in EXIT_GATES, "exit_gate", f"one of {EXIT_GATES}")
    if model.rope_scaling is not None:
        need(model.rope_scaling.get("rope_type") == "llama3", "rope_scaling",
             "null or a llama3 rule {rope_type: llama3, factor, low_freq_factor, high_freq_factor, "
             "original_max_position_embeddings}")
        for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            need(k in model.rope_scaling, "rope_scaling", f"a llama3 rule with key {k!r}")
        check_rope_scaling(model.rope_scaling, f"{prefix}.rope_scaling")


def check_rope_scaling(rule: dict, prefix: str) -> None:
    """The numbers of a llama3 RoPE rule (App. C.1): factor >= 1 stretches the low frequencies (0
    would divide by zero: every step NaN), 0 < low_freq_factor < high_freq_factor bound the band
    that is interpolated, the original context is a positive integer."""
    def number(key: str) -> float | None:
        value = rule[key]
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    factor, low, high = number("factor"), number("low_freq_factor"), number("high_freq_factor")
    original = rule["original_max_position_embeddings"]
    for key, ok, expected in (
            ("factor", factor is not None and factor >= 1, "a number >= 1 (how far the low frequencies are stretched)"),
            ("low_freq_factor", low is not None and low > 0, "a positive number"),
            ("high_freq_factor", high is not None and low is not None and high > low,
             f"a number > low_freq_factor={rule['low_freq_factor']!r}"),
            ("original_max_position_embeddings", isinstance(original, int) and not isinstance(original, bool)
             and original >= 1, "a positive integer (the context the rule extends)")):
        if not ok:
            raise LoopConfigError(f"{prefix}.{key}={rule[key]!r}: expected {expected}")


def validate_train(train: TrainConfig, prefix: str = "train") -> None:
    need = _checker(train, prefix)

    need(train.global_batch_size >= 1, "global_batch_size", "a positive integer")
    need(train.micro_batch_size >= 1, "micro_batch_size", "a positive integer")
    need(train.global_batch_size % train.micro_batch_size == 0, "global_batch_size",
         f"a multiple of micro_batch_size={train.micro_batch_size} (global = micro x accumulation x data-parallel)")
    need(train.seq_length >= 2, "seq_length", "an integer >= 2")
    need(train.lr > 0, "lr", "a positive float")
    need(train.lr <= MAX_LR, "lr", f"at most {MAX_LR:g} (a peak learning rate: the paper's are about 1.3e-3 to "
         "1.8e-3, the tiny configs' 3e-3; above 1 every update overshoots and the loss diverges)")
    need(0 <= train.min_lr_ratio <= 1, "min_lr_ratio", "a float in [0, 1]")
    need(0 <= train.warmup_fraction and 0 <= train.stable_fraction
         and train.warmup_fraction + train.stable_fraction <= 1, "warmup_fraction",
         "warmup_fraction + stable_fraction <= 1, both >= 0")
    need(train.weight_decay >= 0, "weight_decay", "a float >= 0")
    # AdamW betas and the Muon momentum are exponential decay rates: 1 or more never forgets
    # (or diverges), so the first optimizer step would fail instead of this line (App. C.2).
    for key in ("adam_beta1", "adam_beta2", "muon_momentum"):
        need(0 <= getattr(train, key) < 1, key, "a float in [0, 1) (an exponential decay rate)")
    need(train.adam_eps >= 0, "adam_eps", "a float >= 0")
    need(train.tokens_per_parameter > 0, "tokens_per_parameter",
         "a positive number (the Chinchilla token budget, 20 in the paper)")
    need(train.eval_batches >= 1, "eval_batches", "a positive integer (micro-batches per validation; "
         "to train without validation set train.eval_interval: 0)")
    need(train.muon_scale in ("match_rms_adamw", "original"), "muon_scale", "'match_rms_adamw' or 'original'")
    need(train.muon_ns_steps >= 1, "muon_ns_steps", "an integer >= 1")
    need(train.grad_clip > 0, "grad_clip", "a positive float")
    need(train.optimizer in OPTIMIZERS, "optimizer", f"one of {OPTIMIZERS}")
    need(not train.muon_conditioning_matrices or train.optimizer == "muon_adamw", "muon_conditioning_matrices",
         f"false unless optimizer is 'muon_adamw' (optimizer={train.optimizer!r})")
    need(train.train_tokens is None or train.train_tokens > 0, "train_tokens", "null or a positive integer")
    need(train.max_steps is None or train.max_steps >= 1, "max_steps", "null or a positive integer")
    need(train.precision in ("auto", "bf16", "fp32"), "precision", "'auto', 'bf16' or 'fp32'")
    need(train.save_interval >= 1, "save_interval", "a positive integer")
    need(train.keep_last >= 1, "keep_last", "a positive integer")
    need(train.log_interval >= 1, "log_interval", "a positive integer")
    need(train.eval_interval >= 0, "eval_interval", "an integer >= 0 (0 disables periodic validation)")
    need(train.eval_loops is None or all(r >= 1 for r in train.eval_loops), "eval_loops",
         "null or a list of loop counts >= 1")
    need(train.eval_loops is None or all(r <= MAX_LOOPS for r in train.eval_loops), "eval_loops",
         f"loop counts of at most {MAX_LOOPS} (a validation at r runs L(r) = p + r s block applications per token)")
    need(train.eval_loops is None or train.eval_loops == sorted(set(train.eval_loops)), "eval_loops",
         f"distinct loop counts in increasing order, e.g. {sorted(set(train.eval_loops or []))}")
    need(train.eval_loops is None or len(train.eval_loops) > 0, "eval_loops",
         "null (K/2, K, 2K) or a non-empty list of loop counts; to train without validation set "
         "train.eval_interval: 0")
    need(train.nan_policy in ("skip", "stop"), "nan_policy", "'skip' or 'stop'")
    need(train.schedule_on_resume in CHOICES["train.schedule_on_resume"], "schedule_on_resume",
         "'continue_decay' or 'rewarm'")  # rederive: rewarm's name before issue 43 (older run configs)
    need(train.init_from is None or bool(str(train.init_from).strip()), "init_from",
         "null or the path of another run's checkpoint folder (.../train/checkpoints) or of one global_step* "
         "folder in it")
    need(train.init_from_missing in INIT_FROM_MISSING, "init_from_missing", f"one of {INIT_FROM_MISSING}")
    need(train.init_from is not None or train.init_from_missing == "error", "init_from_missing",
         "its default 'error' unless train.init_from is set (it decides what a weights-only start does with "
         "parameters the checkpoint lacks)")
    need(train.max_consecutive_nonfinite >= 1, "max_consecutive_nonfinite", "a positive integer")
    need(train.divergence_lr_factor is None or 0 < train.divergence_lr_factor < 1, "divergence_lr_factor",
         "null or a number in (0, 1) (the lr of a resume after a stop on non-finite values, per stop, e.g. 0.5)")
    need(train.wall_time_limit_s is None or train.wall_time_limit_s > 0, "wall_time_limit_s",
         "null or a positive number of seconds")
    need(train.exit_interval is None or train.exit_interval >= 1, "exit_interval", "null or a positive integer")
    need(train.collective_timeout_s > 0, "collective_timeout_s", "a positive number of seconds")
    need(train.collective_timeout_s <= MAX_TIMEOUT_S, "collective_timeout_s",
         f"at most {MAX_TIMEOUT_S:,.0f} seconds (7 days)")
    need(0 <= train.seed <= MAX_SEED, "seed", f"an integer in [0, 2^32 - 1 = {MAX_SEED}] (numpy's seed range)")
    need(train.loop_sampling in LOOP_SAMPLINGS, "loop_sampling", f"one of {LOOP_SAMPLINGS}")
    need(train.loop_sampling_per in LOOP_SAMPLING_UNITS, "loop_sampling_per", f"one of {LOOP_SAMPLING_UNITS}")
    for key in ("shortcut_short_loss_weight", "shortcut_consistency_weight"):  # LoopFormer (model/shortcut.py)
        need(0 <= getattr(train, key) < float("inf"), key, "a finite number >= 0 (LoopFormer: 0.1)")
        need(train.shortcut_consistency or getattr(train, key) == 0.1, key, "its default 0.1 unless "
             "train.shortcut_consistency is true (the weight is unused without LoopFormer's objective)")
    need(train.loop_sampling_sigma > 0, "loop_sampling_sigma", "a positive float (log-normal sigma)")
    need(train.loop_sampling_min >= 1, "loop_sampling_min", "an integer >= 1")
    need(train.loop_sampling_min <= MAX_LOOPS, "loop_sampling_min", f"at most {MAX_LOOPS}")
    need(train.loop_sampling_max is None or train.loop_sampling_max >= train.loop_sampling_min, "loop_sampling_max",
         f"null or an integer >= loop_sampling_min={train.loop_sampling_min}")
    need(train.loop_sampling_max is None or train.loop_sampling_max <= MAX_LOOPS, "loop_sampling_max",
         f"null or at most {MAX_LOOPS}")
    need(train.backprop_loops is None or train.backprop_loops >= 1, "backprop_loops",
         "null (backpropagate through every loop) or an integer >= 1")
    need(train.exit_gate_objective in EXIT_GATE_OBJECTIVES, "exit_gate_objective", f"one of {EXIT_GATE_OBJECTIVES}")
    need(train.exit_entropy_beta >= 0, "exit_entropy_beta", "a float >= 0 (Ouro's entropy weight, 0.1)")
    need(train.exit_gate_k > 0, "exit_gate_k", "a positive float (Ouro's slope k, 50)")
    need(train.exit_gate_gamma >= 0, "exit_gate_gamma", "a float >= 0 (Ouro's improvement margin gamma, 0.005)")
    if train.loop_sampling == "fixed":  # the sampling settings would be silently unused
        defaults = type(train)()
        for key in ("loop_sampling_sigma", "loop_sampling_min", "loop_sampling_max", "loop_sampling_per"):
            need(getattr(train, key) == getattr(defaults, key), key,
                 f"its default {getattr(defaults, key)!r} with loop_sampling='fixed' (every step runs "
                 "model.train_loops; set train.loop_sampling to poisson_lognormal or uniform to use it)")


def validate_data(data: DataConfig, prefix: str = "data") -> None:
    if data.order not in DATA_ORDERS:
        raise LoopConfigError(f"{prefix}.order={data.order!r}: expected one of {DATA_ORDERS}")
    if data.train_weights is not None and len(data.train_weights) != len(data.train_prefixes):
        raise LoopConfigError(
            f"{prefix}.train_weights: expected one weight per train prefix "
            f"({len(data.train_prefixes)}), got {len(data.train_weights)}")
    if data.train_weights is not None and any(w <= 0 for w in data.train_weights):
        raise LoopConfigError(f"{prefix}.train_weights={data.train_weights}: expected positive weights")
    if data.num_workers < 0:
        raise LoopConfigError(f"{prefix}.num_workers={data.num_workers}: expected an integer >= 0")
    if not data.worker_timeout_s > 0:
        raise LoopConfigError(f"{prefix}.worker_timeout_s={data.worker_timeout_s}: expected a positive number "
                              "of seconds")
    if data.worker_timeout_s > MAX_TIMEOUT_S:
        raise LoopConfigError(f"{prefix}.worker_timeout_s={data.worker_timeout_s}: expected at most "
                              f"{MAX_TIMEOUT_S:,.0f} seconds (7 days)")
    if not data.max_epochs > 0:
        raise LoopConfigError(f"{prefix}.max_epochs={data.max_epochs}: expected a positive number of epochs")
    check_prefixes(data, os.path.normpath, prefix)


def check_prefixes(data: DataConfig, same: Callable[[str], str], prefix: str = "data") -> None:
    """Each prefix once, and validation data that is not training data (a validation prefix that is a
    train prefix would report the training loss as the held-out one). ``same`` names a prefix's
    files: the path as written here, the real path once the paths are resolved (config/paths.py)."""
    for key, prefixes in (("train_prefixes", data.train_prefixes), ("valid_prefixes", data.valid_prefixes or [])):
        seen = [same(p) for p in prefixes]
        twice = next((i for i, p in enumerate(seen) if p in seen[:i]), None)
        if twice is not None:
            hint = " (data.train_weights sets how much of each is read)" if key == "train_prefixes" else ""
            raise LoopConfigError(f"{prefix}.{key}[{twice}]={prefixes[twice]!r}: listed twice; expected each "
                                  f"prefix once{hint}")
    trained = {same(p) for p in data.train_prefixes}
    for i, p in enumerate(data.valid_prefixes or []):
        if same(p) in trained:
            raise LoopConfigError(f"{prefix}.valid_prefixes[{i}]={p!r}: also a train prefix; expected held-out "
                                  "data (tools/preprocess_data.py --validation-documents writes P_valid)")


def validate_logging(logging: LoggingConfig, prefix: str = "logging") -> None:
    if not isinstance(logging.dynamics_interval, int) or logging.dynamics_interval < 0:
        raise LoopConfigError(f"{prefix}.dynamics_interval={logging.dynamics_interval!r}: expected an integer >= 0 "
                              f"(0 = off)")
    if logging.peak_tflops is not None and logging.peak_tflops <= 0:
        raise LoopConfigError(f"{prefix}.peak_tflops={logging.peak_tflops!r}: expected null or a positive number")
    if logging.wandb_mode not in ("auto", "online", "offline", "disabled"):
        raise LoopConfigError(
            f"{prefix}.wandb_mode={logging.wandb_mode!r}: expected 'auto', 'online', 'offline' or 'disabled'")


def loop_range(train: TrainConfig, train_loops: int) -> tuple[int, int | None]:
    """(smallest, largest) loop count a step can draw under ``train.loop_sampling``; ``None``:
    unbounded (the Poisson tail). Uniform sampling with ``loop_sampling_max`` null draws from
    [min, 2K - min], so that its mean is K."""
    if train.loop_sampling == "fixed":
        return train_loops, train_loops
    if train.loop_sampling == "uniform":
        low = train.loop_sampling_min
        return low, (2 * train_loops - low if train.loop_sampling_max is None else train.loop_sampling_max)
    return train.loop_sampling_min, train.loop_sampling_max


def check_loop_sampling(cfg: Config) -> None:
    """Cross-section checks of ``train.loop_sampling`` / ``train.backprop_loops`` (one error, naming the key)."""
    t, k = cfg.train, cfg.model.train_loops
    where = f"train.loop_sampling={t.loop_sampling!r}"
    if t.loop_sampling == "poisson_lognormal" and k < 2:
        raise LoopConfigError(f"{where} with model.train_loops={k}: expected train_loops >= 2 "
                              "(the mean K is 1 + the mean of a Poisson rate, which must be positive)")
    low, high = loop_range(t, k)
    if t.loop_sampling == "uniform" and high < low:
        raise LoopConfigError(f"train.loop_sampling_min={low}: expected at most model.train_loops={k} "
                              "(uniform sampling with loop_sampling_max null has mean K over [min, 2K - min])")
    n = t.backprop_loops
    truncates = n is not None and (high is None or n < high)
    if truncates and cfg.model.initial_injection == "none":
        no_truncation = "null" if high is None else f"null or >= {high} (the largest loop count)"
        raise LoopConfigError(
            f"train.backprop_loops={n}: with model.initial_injection='none' the loops that run without a "
            "graph cut the embedding and the Prelude off from the gradient; expected an initial-state "
            "injection (model.initial_injection: scalar, channel, residual_channel or dense), as Huginn "
            f"and Parcae use, or train.backprop_loops {no_truncation}")


def check_shortcut_consistency(cfg: Config) -> None:
    """LoopFormer's objective (model/shortcut.py) trains the full trajectory of K loops and a short one:
    K >= 2, every loop graphed, no other objective."""
    t, m = cfg.train, cfg.model
    if not t.shortcut_consistency:
        return
    where = "train.shortcut_consistency=true"
    if m.train_loops < 2:
        raise LoopConfigError(f"{where} with model.train_loops={m.train_loops}: expected train_loops >= 2 (a short "
                              "trajectory has 1..K-1 steps)")
    if t.loop_sampling != "fixed" or t.backprop_loops is not None:
        raise LoopConfigError(f"{where} with train.loop_sampling={t.loop_sampling!r}, train.backprop_loops="
                              f"{t.backprop_loops}: expected 'fixed' and null (LoopFormer's full trajectory is the "
                              "K training loops with full backpropagation; the short one varies the depth)")
    if getattr(m, "exit_gate", "none") != "none":
        raise LoopConfigError(f"{where} with model.exit_gate={m.exit_gate!r}: expected 'none' (one training "
                              "objective at a time: LoopFormer's or Ouro's)")


def check_history_window(cfg: Config) -> None:
    """A training step with r loops reads at most r - 2 past states (m_l = min(w, max(l - 1, 0)),
    Eq. history_state_injection), so lags far past the largest training loop count are parameters
    no step ever trains; refused beyond that loop count (w <= K, or the largest r loop sampling draws)."""
    m = cfg.model
    high = loop_range(cfg.train, m.train_loops)[1]
    if m.history_injection != "none" and high is not None and m.history_window > high:
        raise LoopConfigError(
            f"model.history_window={m.history_window}: expected at most the largest training loop count {high} "
            f"(model.train_loops={m.train_loops}): a step of r loops reads at most r - 2 past states "
            "(m_l = min(w, max(l - 1, 0))), so the lags beyond are never trained")


def check_exit_gate(cfg: Config) -> None:
    """Ouro's gate and its objective come together (a gate without one would never train), and on TP = 1."""
    gate, objective = cfg.model.exit_gate, cfg.train.exit_gate_objective
    if (gate == "learned") != (objective != "none"):
        raise LoopConfigError(f"train.exit_gate_objective={objective!r} with model.exit_gate={gate!r}: expected "
                              "entropy_regularized or adaptive_gate exactly when the exit gate is learned")
    if gate == "learned" and cfg.parallel.tensor_model_parallel_size > 1:
        raise LoopConfigError(EXIT_GATE_TP_REFUSAL)
    high = loop_range(cfg.train, cfg.model.train_loops)[1]
    if gate == "learned" and high is not None and high < 2:
        raise LoopConfigError(f"model.exit_gate='learned' with model.train_loops={cfg.model.train_loops}: expected "
                              "train_loops >= 2 (Ouro's gate chooses the loop to exit at; with one loop the exit "
                              "distribution is 1 at t = 1 whatever the gate says, so it never trains)")


def validate_config(cfg: Config) -> None:
    """Every section, then the checks across sections; fills ``train.eval_loops`` when null
    (K/2, K, 2K; the prefix grid cannot extrapolate past K, App. C.1)."""
    validate_model(cfg.model)
    validate_train(cfg.train)
    validate_data(cfg.data)
    validate_logging(cfg.logging)
    cfg.parallel.validate()
    cfg.parallel.check_model(cfg.model)
    if cfg.train.seq_length > cfg.model.max_position_embeddings:
        raise LoopConfigError(
            f"train.seq_length={cfg.train.seq_length}: expected at most the model's maximum context "
            f"model.max_position_embeddings={cfg.model.max_position_embeddings}")
    check_loop_sampling(cfg)
    check_shortcut_consistency(cfg)
    check_history_window(cfg)
    if cfg.model.initial_state == "noise" and cfg.parallel.tensor_model_parallel_size > 1:
        raise LoopConfigError(NOISE_STATE_TP_REFUSAL)
    if cfg.model.initial_state == "noise" and getattr(cfg.train, "shortcut_consistency", False):
        raise LoopConfigError("model.initial_state='noise' with train.shortcut_consistency=true: expected one of them "
                              "(LoopFormer's objective runs its trajectories without the step's noise seed)")
    check_exit_gate(cfg)
    if cfg.train.eval_loops is None:
        k = cfg.model.train_loops
        loops = {max(1, k // 2), k, 2 * k}
        if cfg.model.timestep != "none" and cfg.model.timestep_grid == "prefix":
            loops = {r for r in loops if r <= k}  # the prefix grid cannot extrapolate (App. C.1)
        cfg.train.eval_loops = sorted(loops)
