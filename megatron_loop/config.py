"""Typed, validated configuration: YAML -> dataclasses, ``--set key.path=value`` overrides.

The ``model:`` section uses the HF export vocabulary of SPEC.md (``prelude_layers``,
``core_layers``, ``train_loops``, ``coda_layers``, ``initial_injection``, ...), plus
``backbone`` (a preset from App. C.1 whose fields the others override) and
``activation_checkpointing``. Every error names the key and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from megatron_loop.errors import LoopConfigError
from megatron_loop.parallel.config import ParallelConfig

# --------------------------------------------------------------------------------------
# Backbone presets (App. C.1, Table 1)
# --------------------------------------------------------------------------------------

LLAMA3_ROPE_SCALING = {
    # Llama 3 RoPE scaling rule (App. C.1): original context 8,192, max context 131,072.
    # factor/low/high are those of the Llama 3.1 release.
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

BACKBONES: dict[str, dict[str, Any]] = {
    # Llama3.1-1B: 20-layer reference, 1,007,482,368 parameters.
    "llama3.1-1b": dict(
        hidden_size=1536, intermediate_size=5376, num_attention_heads=12, num_key_value_heads=3,
        head_dim=128, vocab_size=128256, rms_norm_eps=1e-5, rope_theta=5e5,
        rope_scaling=dict(LLAMA3_ROPE_SCALING), max_position_embeddings=131072,
        qk_norm=False, tie_word_embeddings=False,
    ),
    # Qwen3-0.6B: 28-layer reference, 596,049,920 parameters.
    "qwen3-0.6b": dict(
        hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None,
        max_position_embeddings=40960, qk_norm=True, tie_word_embeddings=True,
    ),
    # CPU-sized twins of the two families (same block structure, tiny widths).
    "tiny-llama": dict(
        hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=2048, rms_norm_eps=1e-5, rope_theta=5e5,
        rope_scaling=dict(LLAMA3_ROPE_SCALING, original_max_position_embeddings=256),
        max_position_embeddings=4096, qk_norm=False, tie_word_embeddings=False,
    ),
    "tiny-qwen": dict(
        hidden_size=64, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=2048, rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None,
        max_position_embeddings=4096, qk_norm=True, tie_word_embeddings=True,
    ),
}

INITIAL_INJECTIONS = ("none", "scalar", "channel", "residual_channel", "dense")
HISTORY_INJECTIONS = ("none", "scalar", "channel", "dense")
TIMESTEPS = ("none", "loop_gating", "branch_gating", "adaln")
TIMESTEP_GRIDS = ("rescaled", "prefix")
CHECKPOINTING = ("none", "per_loop", "selective", "auto", "per_block")  # megatron_loop/model/checkpointing.py
LOSS_IMPLEMENTATIONS = ("auto", "chunked", "fused")  # megatron_loop/perf.py
# The readings of the paper's ambiguous passages, as switches (issue 14; defaults = the
# original behaviour). Each is documented where it acts and in docs/CONFIG.md.
NOISY_INITIAL_INJECTIONS = ("scalar", "channel", "residual_channel")  # App. E.1 ablation
LOOP_GATING_REFERENCES = ("state", "injected")
OPTIMIZERS = ("muon_adamw", "adamw")
DATA_ORDERS = ("shuffled", "stream")
LOOP_SAMPLINGS = ("fixed", "poisson_lognormal", "uniform")  # train.loop_sampling (issue 15)


# --------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    """Architecture ``p+s×K+c`` and the conditioning mechanisms (Sec. 2.1, Sec. 5, App. C.1)."""

    backbone: str | None = None
    prelude_layers: int = 0
    core_layers: int = 4
    train_loops: int = 1
    coda_layers: int = 0
    hidden_size: int = 64
    intermediate_size: int = 160
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    vocab_size: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    initial_injection: str = "none"
    history_injection: str = "none"
    history_window: int = 1
    timestep: str = "none"
    timestep_grid: str = "rescaled"
    # Std of Gaussian noise added to the identity initialisation of scalar / channel /
    # residual_channel initial-state injection (App. E.1 ablation: 0.03; the paper's default 0).
    injection_init_noise: float = 0.0
    # What Loop Gating mixes with the core output: the recurrent state h_l (``state``) or the
    # core's actual (injected) input u_l (``injected``); see conditioning.LoopGating.
    loop_gating_reference: str = "state"
    activation_checkpointing: str = "per_loop"
    # activation_checkpointing=auto: GiB of activation memory a training micro-batch may use
    # (peak above parameters, gradients and optimizer state); null: 90 % of the GPU minus what is
    # allocated at the first step (no limit on CPU). See megatron_loop/model/checkpointing.py.
    activation_checkpointing_budget_gib: float | None = None
    # activation_checkpointing=auto: what recomputing a selective loop costs, in loop forwards;
    # null: the FLOP share of the matmuls the selective policy recomputes (unmeasured on GPU,
    # where elementwise work adds to it; tools/bench.py measures it). See checkpointing.py.
    activation_checkpointing_selective_cost: float | None = None
    # torch.compile each transformer block once (static shapes) and reuse it at every loop:
    # changing r never recompiles (megatron_loop/perf.py). auto: on when CUDA is available (it
    # pays there, docs/BENCHMARKS.md), off on CPU (start-up time, needs a C++ compiler).
    compile: bool | str = "auto"
    # LM head + cross-entropy: chunked (torch, the reference), fused (Liger-Kernel's Triton
    # kernel, CUDA), auto (fused on CUDA when liger-kernel is installed, chunked otherwise).
    loss_implementation: str = "auto"

    # ---- derived quantities (App. C.1 "BaseLoop and CoreLoop models")
    @property
    def physical_depth(self) -> int:
        return self.prelude_layers + self.core_layers + self.coda_layers

    def effective_depth(self, num_loops: int | None = None) -> int:
        r = self.train_loops if num_loops is None else num_loops
        return self.prelude_layers + r * self.core_layers + self.coda_layers

    @property
    def compile_enabled(self) -> bool:
        """``compile`` resolved: ``auto`` is on exactly when CUDA is available."""
        if self.compile == "auto":
            import torch

            return torch.cuda.is_available()
        return bool(self.compile)

    @property
    def layout(self) -> str:
        return f"{self.prelude_layers}+{self.core_layers}x{self.train_loops}+{self.coda_layers}"

    def validate(self, prefix: str = "model") -> None:
        def need(cond: bool, key: str, expected: str) -> None:
            if not cond:
                raise LoopConfigError(f"{prefix}.{key}={getattr(self, key)!r}: expected {expected}")

        if self.backbone is not None and self.backbone not in BACKBONES:
            raise LoopConfigError(
                f"{prefix}.backbone={self.backbone!r}: unknown backbone; expected one of {sorted(BACKBONES)}")
        need(self.prelude_layers >= 0, "prelude_layers", "an integer >= 0")
        need(self.coda_layers >= 0, "coda_layers", "an integer >= 0")
        need(self.core_layers >= 1, "core_layers", "an integer >= 1 (the shared core needs a block)")
        need(self.train_loops >= 1, "train_loops", "an integer >= 1")
        for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "vocab_size", "max_position_embeddings"):
            need(getattr(self, key) >= 1, key, "a positive integer")
        need(self.num_attention_heads % self.num_key_value_heads == 0, "num_attention_heads",
             f"a multiple of num_key_value_heads={self.num_key_value_heads} (grouped-query attention)")
        need(self.head_dim % 2 == 0, "head_dim", "an even number (rotary embedding)")
        need(self.rms_norm_eps > 0, "rms_norm_eps", "a positive float")
        need(self.rope_theta > 0, "rope_theta", "a positive float")
        need(self.initializer_range > 0, "initializer_range", "a positive float")
        need(self.initial_injection in INITIAL_INJECTIONS, "initial_injection", f"one of {INITIAL_INJECTIONS}")
        need(self.history_injection in HISTORY_INJECTIONS, "history_injection", f"one of {HISTORY_INJECTIONS}")
        need(self.history_window >= 1, "history_window", "an integer >= 1")
        # history_window sizes the history injection's beta (Eq. history_state_injection); a window
        # set without the injection would be silently unused.
        need(self.history_window == 1 or self.history_injection != "none", "history_window",
             "1 (the default) unless history_injection is set (history_injection='none' reads no past states)")
        need(self.timestep in TIMESTEPS, "timestep", f"one of {TIMESTEPS}")
        need(self.timestep_grid in TIMESTEP_GRIDS, "timestep_grid", f"one of {TIMESTEP_GRIDS}")
        need(self.injection_init_noise >= 0, "injection_init_noise", "a float >= 0 (a standard deviation)")
        need(self.injection_init_noise == 0 or self.initial_injection in NOISY_INITIAL_INJECTIONS,
             "injection_init_noise", f"0 unless initial_injection is one of {NOISY_INITIAL_INJECTIONS} "
             f"(the App. E.1 ablation; initial_injection={self.initial_injection!r})")
        need(self.loop_gating_reference in LOOP_GATING_REFERENCES, "loop_gating_reference",
             f"one of {LOOP_GATING_REFERENCES}")
        need(self.loop_gating_reference == "state" or self.timestep == "loop_gating", "loop_gating_reference",
             f"'state' unless timestep is 'loop_gating' (timestep={self.timestep!r})")
        need(self.activation_checkpointing in CHECKPOINTING, "activation_checkpointing", f"one of {CHECKPOINTING}")
        need(self.activation_checkpointing_budget_gib is None or (
            self.activation_checkpointing == "auto" and self.activation_checkpointing_budget_gib > 0),
            "activation_checkpointing_budget_gib", "null, or a positive number of GiB with activation_checkpointing=auto")
        need(self.activation_checkpointing_selective_cost is None or (
            self.activation_checkpointing == "auto" and 0 < self.activation_checkpointing_selective_cost <= 1),
            "activation_checkpointing_selective_cost",
            "null, or a number in (0, 1] (loop forwards) with activation_checkpointing=auto")
        need(self.compile in (True, False, "auto"), "compile", "true, false or 'auto' (on with CUDA)")
        need(self.loss_implementation in LOSS_IMPLEMENTATIONS, "loss_implementation",
             f"one of {LOSS_IMPLEMENTATIONS}")
        if self.rope_scaling is not None:
            need(self.rope_scaling.get("rope_type") == "llama3", "rope_scaling",
                 "null or a llama3 rule {rope_type: llama3, factor, low_freq_factor, high_freq_factor, "
                 "original_max_position_embeddings}")
            for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
                need(k in self.rope_scaling, "rope_scaling", f"a llama3 rule with key {k!r}")


@dataclass
class TrainConfig:
    """Training recipe (App. C.2, Table 3)."""

    global_batch_size: int = 8
    micro_batch_size: int = 4
    seq_length: int = 2048
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_fraction: float = 0.05
    stable_fraction: float = 0.85
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    muon_momentum: float = 0.95
    muon_nesterov: bool = True
    muon_ns_steps: int = 5
    muon_scale: str = "match_rms_adamw"
    grad_clip: float = 1.0
    # ``muon_adamw``: Muon for hidden matrices, AdamW for the rest (App. C.2); ``adamw``: AdamW
    # for every parameter (the optimizer ablation of App. D.1, Table 7).
    optimizer: str = "muon_adamw"
    # Whether the dense injection matrices (dense initial-state W = [W_h W_0], dense history
    # B_j) go to Muon (true) or AdamW (false). The paper reads both ways: Sec. 2.2 gives Muon
    # "hidden matrix parameters" and AdamW "embeddings, output heads, biases, and other non-matrix
    # parameters" (-> Muon: they are d x 2d / d x d matrices acting on hidden states); App. C.2
    # gives Muon "the matrix-valued attention and feed-forward projection weights" and AdamW
    # the rest (-> AdamW: they are no attention/MLP projection), the default kept here. AdaLN's
    # W_k^b (2d x 8, Eq. adaln_timestep_parameters) goes to AdamW under either value: it maps the 8
    # fixed timestep features psi_l, not a hidden state (model/roles.py, set_conditioning_matrix).
    muon_conditioning_matrices: bool = False
    train_tokens: int | None = None
    max_steps: int | None = None
    tokens_per_parameter: float = 20.0
    seed: int = 42
    precision: str = "auto"
    deepspeed_config: str = "deepspeed_configs/zero1.json"
    output_dir: str = "runs/default"
    save_interval: int = 1000
    keep_last: int = 3
    log_interval: int = 1
    eval_interval: int = 0
    eval_loops: list[int] | None = None
    eval_batches: int = 4
    resume: bool = True
    nan_policy: str = "skip"
    max_consecutive_nonfinite: int = 5
    wall_time_limit_s: float | None = None
    # Exit (after saving a checkpoint) once the step number is a multiple of this, as
    # Megatron-LM's --exit-interval: a planned stop that keeps the full run's schedule.
    exit_interval: int | None = None
    # Longest wait of any collective before the run stops with an error: a rank that stopped or
    # hung would otherwise block the others for DeepSpeed's default 30 minutes.
    collective_timeout_s: float = 600.0
    # Variable depth in training (issue 15, megatron_loop/training/loop_sampling.py): the loop
    # count of each optimizer step, fixed = model.train_loops (the paper) or drawn from the seed
    # and the step; backprop_loops truncates backpropagation to the last N loops (null: all).
    loop_sampling: str = "fixed"
    loop_sampling_sigma: float = 0.5
    loop_sampling_min: int = 1
    loop_sampling_max: int | None = None
    backprop_loops: int | None = None

    def validate(self, prefix: str = "train") -> None:
        def need(cond: bool, key: str, expected: str) -> None:
            if not cond:
                raise LoopConfigError(f"{prefix}.{key}={getattr(self, key)!r}: expected {expected}")

        need(self.global_batch_size >= 1, "global_batch_size", "a positive integer")
        need(self.micro_batch_size >= 1, "micro_batch_size", "a positive integer")
        need(self.global_batch_size % self.micro_batch_size == 0, "global_batch_size",
             f"a multiple of micro_batch_size={self.micro_batch_size} (global = micro x accumulation x data-parallel)")
        need(self.seq_length >= 2, "seq_length", "an integer >= 2")
        need(self.lr > 0, "lr", "a positive float")
        need(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "a float in [0, 1]")
        need(0 <= self.warmup_fraction and 0 <= self.stable_fraction
             and self.warmup_fraction + self.stable_fraction <= 1, "warmup_fraction",
             "warmup_fraction + stable_fraction <= 1, both >= 0")
        need(self.weight_decay >= 0, "weight_decay", "a float >= 0")
        # AdamW betas and the Muon momentum are exponential decay rates: 1 or more never forgets
        # (or diverges), so the first optimizer step would fail instead of this line (App. C.2).
        for key in ("adam_beta1", "adam_beta2", "muon_momentum"):
            need(0 <= getattr(self, key) < 1, key, "a float in [0, 1) (an exponential decay rate)")
        need(self.adam_eps >= 0, "adam_eps", "a float >= 0")
        need(self.tokens_per_parameter > 0, "tokens_per_parameter",
             "a positive number (the Chinchilla token budget, 20 in the paper)")
        need(self.eval_batches >= 1, "eval_batches", "a positive integer (micro-batches per validation; "
             "to train without validation set train.eval_interval: 0)")
        need(self.muon_scale in ("match_rms_adamw", "original"), "muon_scale", "'match_rms_adamw' or 'original'")
        need(self.muon_ns_steps >= 1, "muon_ns_steps", "an integer >= 1")
        need(self.grad_clip > 0, "grad_clip", "a positive float")
        need(self.optimizer in OPTIMIZERS, "optimizer", f"one of {OPTIMIZERS}")
        need(not self.muon_conditioning_matrices or self.optimizer == "muon_adamw", "muon_conditioning_matrices",
             f"false unless optimizer is 'muon_adamw' (optimizer={self.optimizer!r})")
        need(self.train_tokens is None or self.train_tokens > 0, "train_tokens", "null or a positive integer")
        need(self.max_steps is None or self.max_steps >= 1, "max_steps", "null or a positive integer")
        need(self.precision in ("auto", "bf16", "fp32"), "precision", "'auto', 'bf16' or 'fp32'")
        need(self.save_interval >= 1, "save_interval", "a positive integer")
        need(self.keep_last >= 1, "keep_last", "a positive integer")
        need(self.log_interval >= 1, "log_interval", "a positive integer")
        need(self.eval_interval >= 0, "eval_interval", "an integer >= 0 (0 disables periodic validation)")
        need(self.eval_loops is None or all(r >= 1 for r in self.eval_loops), "eval_loops",
             "null or a list of loop counts >= 1")
        need(self.eval_loops is None or len(self.eval_loops) > 0, "eval_loops",
             "null (K/2, K, 2K) or a non-empty list of loop counts; to train without validation set "
             "train.eval_interval: 0")
        need(self.nan_policy in ("skip", "stop"), "nan_policy", "'skip' or 'stop'")
        need(self.max_consecutive_nonfinite >= 1, "max_consecutive_nonfinite", "a positive integer")
        need(self.wall_time_limit_s is None or self.wall_time_limit_s > 0, "wall_time_limit_s",
             "null or a positive number of seconds")
        need(self.exit_interval is None or self.exit_interval >= 1, "exit_interval", "null or a positive integer")
        need(self.collective_timeout_s > 0, "collective_timeout_s", "a positive number of seconds")
        need(self.loop_sampling in LOOP_SAMPLINGS, "loop_sampling", f"one of {LOOP_SAMPLINGS}")
        need(self.loop_sampling_sigma > 0, "loop_sampling_sigma", "a positive float (log-normal sigma)")
        need(self.loop_sampling_min >= 1, "loop_sampling_min", "an integer >= 1")
        need(self.loop_sampling_max is None or self.loop_sampling_max >= self.loop_sampling_min, "loop_sampling_max",
             f"null or an integer >= loop_sampling_min={self.loop_sampling_min}")
        need(self.backprop_loops is None or self.backprop_loops >= 1, "backprop_loops",
             "null (backpropagate through every loop) or an integer >= 1")
        if self.loop_sampling == "fixed":  # the sampling settings would be silently unused
            defaults = TrainConfig()
            for key in ("loop_sampling_sigma", "loop_sampling_min", "loop_sampling_max"):
                need(getattr(self, key) == getattr(defaults, key), key,
                     f"its default {getattr(defaults, key)!r} with loop_sampling='fixed' (every step runs "
                     "model.train_loops; set train.loop_sampling to poisson_lognormal or uniform to use it)")


@dataclass
class DataConfig:
    """Indexed-dataset prefixes (App. C.1 "Pretraining data and tokenization")."""

    train_prefixes: list[str] = field(default_factory=list)
    train_weights: list[float] | None = None
    # null: ``<first train prefix>_valid`` when it exists (tools/preprocess_data.py
    # --validation-documents writes it); []: no validation; else these prefixes.
    valid_prefixes: list[str] | None = None
    tokenizer: str | None = None
    num_workers: int = 1
    # Longest wait for a batch from the DataLoader workers before the run stops with an error
    # (a worker that hung or was stopped would otherwise freeze the run).
    worker_timeout_s: float = 600.0
    # ``stream`` (the paper, App. C.1): documents packed in the order preprocessing wrote them,
    # i.e. FineWeb-Edu streamed through a 10,000-document shuffle buffer with seed 42; the paper
    # shuffles once, at streaming time. ``shuffled``: a further seed-determined permutation per epoch.
    order: str = "stream"

    def validation_prefixes(self) -> list[str]:
        """The prefixes validation reads: ``valid_prefixes``, or by default the train prefix's sibling."""
        if self.valid_prefixes is not None:
            return list(self.valid_prefixes)
        sibling = sibling_valid_prefix(self.train_prefixes[0]) if self.train_prefixes else None
        return [sibling] if sibling else []

    def validate(self, prefix: str = "data") -> None:
        if self.order not in DATA_ORDERS:
            raise LoopConfigError(f"{prefix}.order={self.order!r}: expected one of {DATA_ORDERS}")
        if self.train_weights is not None and len(self.train_weights) != len(self.train_prefixes):
            raise LoopConfigError(
                f"{prefix}.train_weights: expected one weight per train prefix "
                f"({len(self.train_prefixes)}), got {len(self.train_weights)}")
        if self.train_weights is not None and any(w <= 0 for w in self.train_weights):
            raise LoopConfigError(f"{prefix}.train_weights={self.train_weights}: expected positive weights")
        if self.num_workers < 0:
            raise LoopConfigError(f"{prefix}.num_workers={self.num_workers}: expected an integer >= 0")
        if not self.worker_timeout_s > 0:
            raise LoopConfigError(f"{prefix}.worker_timeout_s={self.worker_timeout_s}: expected a positive number "
                                  "of seconds")


@dataclass
class LoggingConfig:
    wandb_project: str | None = None
    wandb_run_name: str | None = None
    wandb_mode: str = "auto"  # auto: online with an API key, offline without one
    progress_bar: bool = True
    # TensorBoard event files in OUTPUT_DIR/tensorboard (the same scalars as metrics.jsonl).
    tensorboard: bool = False
    # Per-device peak FLOP/s (in TFLOP/s) for the MFU estimate; null: 989 (H100/H200 dense
    # bf16) on GPU, a measured fp32 matmul throughput on CPU.
    peak_tflops: float | None = None

    def validate(self, prefix: str = "logging") -> None:
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise LoopConfigError(f"{prefix}.peak_tflops={self.peak_tflops!r}: expected null or a positive number")
        if self.wandb_mode not in ("auto", "online", "offline", "disabled"):
            raise LoopConfigError(
                f"{prefix}.wandb_mode={self.wandb_mode!r}: expected 'auto', 'online', 'offline' or 'disabled'")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # tensor parallelism: parallel/config.py
    source: str | None = None  # the YAML it came from (for messages)

    def validate(self) -> None:
        self.model.validate()
        self.train.validate()
        self.data.validate()
        self.logging.validate()
        self.parallel.validate()
        self.parallel.check_model(self.model)
        if self.train.seq_length > self.model.max_position_embeddings:
            raise LoopConfigError(
                f"train.seq_length={self.train.seq_length}: expected at most the model's maximum context "
                f"model.max_position_embeddings={self.model.max_position_embeddings}")
        from megatron_loop.training.loop_sampling import check_loop_sampling

        check_loop_sampling(self)
        if self.train.eval_loops is None:
            k = self.model.train_loops
            loops = {max(1, k // 2), k, 2 * k}
            if self.model.timestep != "none" and self.model.timestep_grid == "prefix":
                loops = {r for r in loops if r <= k}  # the prefix grid cannot extrapolate (App. C.1)
            self.train.eval_loops = sorted(loops)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "logging": LoggingConfig,
            "parallel": ParallelConfig}


# --------------------------------------------------------------------------------------
# Typed construction
# --------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "null")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (bool is not an int, int is a float)."""
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except LoopConfigError as e:
                errors.append(e)
        raise LoopConfigError(f"{key}={value!r}: expected {' or '.join(_type_name(a) for a in args)}")
    if origin is list:
        (item,) = get_args(tp)
        if not isinstance(value, list):
            raise LoopConfigError(f"{key}={value!r}: expected a list of {_type_name(item)}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise LoopConfigError(f"{key}={value!r}: expected a boolean (true/false)")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not value.is_integer()):
            raise LoopConfigError(f"{key}={value!r}: expected an integer")
        return int(value)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LoopConfigError(f"{key}={value!r}: expected a number")
        if not math.isfinite(float(value)):
            raise LoopConfigError(f"{key}={value!r}: expected a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise LoopConfigError(f"{key}={value!r}: expected a string")
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise LoopConfigError(f"{key}={value!r}: expected a mapping")
        return dict(value)
    raise LoopConfigError(f"{key}: unsupported annotation {tp}")


def _build_section(cls: type, values: dict, section: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise LoopConfigError(
            f"{section}.{unknown[0]}: unknown key; expected one of {sorted(known)}")
    kwargs = {k: _coerce(v, hints[k], f"{section}.{k}") for k, v in values.items()}
    return cls(**kwargs)


def build_model_config(values: dict, section: str = "model") -> ModelConfig:
    """A ModelConfig from a mapping; ``backbone`` fills every field the mapping leaves out."""
    values = dict(values)
    backbone = values.get("backbone")
    if backbone is not None:
        if backbone not in BACKBONES:
            raise LoopConfigError(
                f"{section}.backbone={backbone!r}: unknown backbone; expected one of {sorted(BACKBONES)}")
        values = {**BACKBONES[backbone], **values}
    cfg = _build_section(ModelConfig, values, section)
    cfg.validate(section)
    return cfg


def _yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's message on one line: the problem and where (its own text spans several lines)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML
    keeps the last silently, so an edit lower in the file would override one higher up)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise LoopConfigError(f"duplicate key {key!r} at line {line} (first at line {seen[key]}); "
                                      "expected each key once in a mapping")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise LoopConfigError(f"--set {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if len(path) < 2 or not all(path):
        raise LoopConfigError(f"--set {text!r}: expected section.key=value (e.g. model.train_loops=3)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise LoopConfigError(f"--set {text!r}: value is not valid YAML ({_yaml_problem(e)})") from None
    return path, value


def config_from_dict(raw: dict, source: str = "<dict>", overrides: list[str] | None = None) -> Config:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise LoopConfigError(f"{source}: expected a mapping with sections {sorted(SECTIONS)}")
    raw = json.loads(json.dumps(raw))  # deep copy of plain data
    for ov in overrides or []:
        path, value = _parse_override(ov)
        node = raw
        for part in path[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise LoopConfigError(f"--set {ov!r}: {part!r} is not a section")
            node = nxt
        node[path[-1]] = value
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise LoopConfigError(f"{source}: unknown section {unknown[0]!r}; expected one of {sorted(SECTIONS)}")
    for name, val in raw.items():
        if not isinstance(val, dict):
            raise LoopConfigError(f"{source}: section {name!r} must be a mapping")
    try:
        cfg = Config(
            model=build_model_config(raw.get("model", {})),
            train=_build_section(TrainConfig, raw.get("train", {}), "train"),
            data=_build_section(DataConfig, raw.get("data", {}), "data"),
            logging=_build_section(LoggingConfig, raw.get("logging", {}), "logging"),
            parallel=_build_section(ParallelConfig, raw.get("parallel", {}), "parallel"),
            source=source,
        )
        cfg.validate()
    except LoopConfigError as e:
        raise LoopConfigError(f"{source}: {e}") from None
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (SPEC.md "Config vocabulary"), apply ``key.path=value`` overrides, validate,
    and make its file paths absolute (:func:`resolve_paths`, relative to the working directory)."""
    path = Path(path)
    if not path.is_file():
        raise LoopConfigError(f"{path}: config file not found")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except LoopConfigError as e:
        raise LoopConfigError(f"{path}: {e}") from None
    except UnicodeDecodeError:
        raise LoopConfigError(f"{path}: not a text file; expected a YAML config (UTF-8)") from None
    except yaml.YAMLError as e:
        raise LoopConfigError(f"{path}: not valid YAML ({_yaml_problem(e)})") from None
    return resolve_paths(config_from_dict(raw, source=str(path), overrides=overrides))


# --------------------------------------------------------------------------------------
# File paths
# --------------------------------------------------------------------------------------

REPOSITORY = Path(__file__).resolve().parents[1]  # holds the shipped deepspeed_configs/


def prefix_exists(prefix: str | os.PathLike) -> bool:
    """An indexed dataset prefix P names P.bin / P.idx, not a file of its own."""
    return any(os.path.isfile(f"{prefix}{ext}") for ext in (".bin", ".idx"))


def sibling_valid_prefix(train_prefix: str | os.PathLike) -> str | None:
    """``P_valid`` next to train prefix ``P`` when it exists (``tools/preprocess_data.py
    --validation-documents`` writes it), else None."""
    from megatron_loop.data.preprocess import VALID_SUFFIX

    sibling = f"{train_prefix}{VALID_SUFFIX}"
    return sibling if prefix_exists(sibling) else None


def resolve_paths(cfg: Config, base: str | os.PathLike | None = None) -> Config:
    """Make the existing relative paths of ``cfg`` absolute (in place; returns ``cfg``).

    The run config is saved next to every checkpoint and read back by the tools
    (``tools/convert_to_hf.py`` takes ``data.tokenizer`` from it), which may run from another
    directory. Relative paths are taken from ``base`` (default: the working directory);
    ``train.deepspeed_config`` falls back to the repository's ``deepspeed_configs/``. A path that
    does not exist stays as written, so the check that reports it names what the user wrote; a
    tokenizer that is not a local path is a hub name and stays too.
    """
    base = Path(os.getcwd() if base is None else base)

    def absolute(path: str, exists) -> str:
        p = Path(path).expanduser()
        if p.is_absolute():
            return str(p)
        candidate = os.path.normpath(base / p)
        return candidate if exists(candidate) else path

    d, t = cfg.data, cfg.train
    d.train_prefixes = [absolute(p, prefix_exists) for p in d.train_prefixes]
    if d.valid_prefixes is not None:
        d.valid_prefixes = [absolute(p, prefix_exists) for p in d.valid_prefixes]
    if d.tokenizer:
        d.tokenizer = absolute(d.tokenizer, os.path.exists)
    ds = absolute(t.deepspeed_config, os.path.isfile)
    if not os.path.isabs(ds) and (REPOSITORY / ds).is_file():
        ds = str(REPOSITORY / ds)
    t.deepspeed_config = ds
    return cfg
