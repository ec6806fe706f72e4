"""The config's sections as typed dataclasses: their keys, types, defaults and derived quantities.

The ``model:`` section uses the HF export vocabulary of SPEC.md (``prelude_layers``,
``core_layers``, ``train_loops``, ``coda_layers``, ``initial_injection``, ...), plus
``backbone`` (a preset from App. C.1 whose fields the others override) and
``recompute``. The checks of the values are in :mod:`megatron_loop.config.validation`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from megatron_loop.config.parallel import ParallelConfig
from megatron_loop.config.paths import sibling_valid_prefix
from megatron_loop.config.validation import (validate_config, validate_data, validate_logging, validate_model,
                                             validate_train)
from megatron_loop.errors import LoopConfigError


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
    # Huginn (Geiping et al. 2025; model/initial_state.py, model/layers.py): ``sandwich`` blocks normalise
    # the residual stream after each branch as well as before it; ``norm_core_output`` applies the final
    # norm to h^r before the Coda (Huginn's ln_f "used twice"); ``initial_state: noise`` starts the
    # recurrence from TruncNormal(0, std^2, +-3 std) noise (std null: Huginn's sqrt(2/5)), the Prelude
    # output entering every loop through the initial-state injection; ``initial_state_seed`` seeds the
    # noise of evaluation and of the HF export (training draws per step from train.seed and the step).
    block_norm: str = "pre"
    norm_core_output: bool = False
    # Ouro (Zhu et al. 2025; modeling_ouro.py): ``block_norm: branch_output`` normalises each branch's output before
    # the residual sum; ``loop_norm`` ends every loop in the final norm (the next loop, the exit gate and the head
    # read Norm(y)).
    loop_norm: bool = False
    initial_state: str = "prelude"
    initial_state_std: float | None = None
    initial_state_seed: int = 0
    recompute: str = "per_loop"
    # recompute=auto: GiB of activation memory a training micro-batch may use
    # (peak above parameters, gradients and optimizer state); null: 90 % of the GPU minus what is
    # allocated at the first step (no limit on CPU). See megatron_loop/model/recompute.py.
    recompute_budget_gib: float | None = None
    # recompute=auto: what recomputing a selective loop costs, in loop forwards;
    # null: the FLOP share of the matmuls the selective policy recomputes (unmeasured on GPU,
    # where elementwise work adds to it; tools/bench.py measures it). See megatron_loop/model/recompute.py.
    recompute_selective_cost: float | None = None
    # torch.compile each transformer block once (static shapes) and reuse it at every loop:
    # changing r never recompiles (megatron_loop/parallel/parallelize.py). auto: on when CUDA is available (it
    # pays there, docs/BENCHMARKS.md), off on CPU (start-up time, needs a C++ compiler).
    compile: bool | str = "auto"
    # LM head + cross-entropy: chunked (torch, the reference), fused (Liger-Kernel's Triton
    # kernel, CUDA), auto (fused on CUDA when liger-kernel is installed, chunked otherwise).
    loss_implementation: str = "auto"
    # Ouro's learned exit gate (Zhu et al. 2025): lambda_t = sigmoid(w^T RMSNorm(h^t) + b) after every
    # loop, inducing the exit distribution p(t|x) (model/exit_gate.py); ``learned`` needs
    # train.exit_gate_objective. Inference: exit_criterion q_exit (eval_loops.py, the HF export).
    exit_gate: str = "none"

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
            import torch  # here, not at the top: loading a config (and --dry-run) must not pay for torch

            return torch.cuda.is_available()
        return bool(self.compile)

    @property
    def layout(self) -> str:
        return f"{self.prelude_layers}+{self.core_layers}x{self.train_loops}+{self.coda_layers}"

    def validate(self, prefix: str = "model") -> None:
        validate_model(self, prefix)


@dataclass
class OptimizerSettings:
    """Muon + AdamW and the WSD learning-rate schedule (App. C.2, Table 3): the optimizer keys of
    the ``train:`` section, declared once. :class:`TrainConfig` inherits them, and the engine
    (:func:`megatron_loop.optim.build_engine`) takes a ``TrainConfig`` or these alone."""

    lr: float = 1e-3  # peak learning rate, shared by the Muon and AdamW groups
    # WSD shape: final lr / peak, warmup and stable fractions of the optimizer steps.
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


@dataclass
class TrainConfig(OptimizerSettings):
    """Training recipe (App. C.2, Table 3): the optimizer keys of :class:`OptimizerSettings`, then these."""

    global_batch_size: int = 8
    micro_batch_size: int = 4
    seq_length: int = 2048
    train_tokens: int | None = None
    max_steps: int | None = None
    tokens_per_parameter: float = 20.0
    seed: int = 42
    precision: str = "auto"
    deepspeed_config: str = "deepspeed_configs/zero1.json"
    output_dir: str = "runs/default"
    save_interval: int = 1000
    keep_last: int = 3
    # false: no checkpoint at the end of the run (interval saves and the save at a stop signal stay):
    # benchmark runs, whose final save would cost more than their steps (tools/gpu_first.sh)
    save_final: bool = True
    log_interval: int = 1
    eval_interval: int = 0
    eval_loops: list[int] | None = None
    eval_batches: int = 4
    resume: bool = True
    # The lr after a resume that changed the schedule (train.max_steps raised, ...): the WSD split is
    # re-derived for the new total either way (from a stable-phase checkpoint the stable phase goes on).
    # From a checkpoint already in its decay, ``continue_decay`` decays on from its lr to min_lr_ratio
    # at the new end; ``rewarm`` goes back up to the new schedule's rate (the peak): an lr jump the
    # user asks for by name, never by default (optim/schedule.py); ``rederive``, its older name, is read
    # as ``rewarm`` (the run configs of older checkpoints record it).
    schedule_on_resume: str = "continue_decay"
    # A weights-only start (training/init_from.py): another run's checkpoint folder or one global_step* folder
    # in it; a fresh start takes that model's weights (optimizer, schedule, step and data position start
    # fresh), a resume of this run's own checkpoint ignores it. init_from_missing: parameters of this model
    # the checkpoint lacks are an error, or keep their initialisation (keep_init: a gate added to a plain run).
    init_from: str | None = None
    init_from_missing: str = "error"
    nan_policy: str = "skip"
    max_consecutive_nonfinite: int = 5
    # After a stop on non-finite values (nan_policy), the run resumed from its last good state trains at
    # train.lr x this factor per recorded stop (training/divergence.py); null: at train.lr as configured.
    divergence_lr_factor: float | None = None
    wall_time_limit_s: float | None = None
    # Exit (after saving a checkpoint) once the step number is a multiple of this, as
    # Megatron-LM's --exit-interval: a planned stop that keeps the full run's schedule.
    exit_interval: int | None = None
    # Longest wait of any collective before the run stops with an error: a rank that stopped or
    # hung would otherwise block the others for DeepSpeed's default 30 minutes.
    collective_timeout_s: float = 600.0
    # Variable depth in training (megatron_loop/training/loop_sampling.py): the loop
    # count of each micro-batch (loop_sampling_per: micro_batch, as Huginn) or optimizer step (step),
    # fixed = model.train_loops (the paper) or drawn from the seed, the step and the micro-batch, the same
    # on every rank; backprop_loops truncates backpropagation to the last N loops (null: all).
    loop_sampling: str = "fixed"
    loop_sampling_per: str = "micro_batch"
    loop_sampling_sigma: float = 0.5
    loop_sampling_min: int = 1
    loop_sampling_max: int | None = None
    backprop_loops: int | None = None
    # LoopFormer (Jeddi et al., ICLR 2026; model/shortcut.py): every micro-batch also runs a short trajectory
    # (M ~ U{1..K-1} steps of sizes n/K, drawn from train.seed, the step and the micro-batch, on every rank) and
    # the loss becomes
    # CE(full) + shortcut_short_loss_weight CE(short) + shortcut_consistency_weight MSE(sg(x_full), x_short).
    shortcut_consistency: bool = False
    shortcut_short_loss_weight: float = 0.1
    shortcut_consistency_weight: float = 0.1
    # Ouro's objectives for model.exit_gate=learned (model/exit_gate.py): entropy_regularized (Stage I,
    # sum_t p(t|x) L^(t) - beta H(p), beta = exit_entropy_beta) or adaptive_gate (Stage II: the LM frozen,
    # the gate learns sigmoid(k (loss improvement - gamma)), k = exit_gate_k, gamma = exit_gate_gamma).
    exit_gate_objective: str = "none"
    exit_entropy_beta: float = 0.1
    exit_gate_k: float = 50.0
    exit_gate_gamma: float = 0.005

    def validate(self, prefix: str = "train") -> None:
        validate_train(self, prefix)


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
    # Most epochs of a train prefix a run may read (training/preflight.py refuses more before the
    # first step): far beyond a few epochs the model memorises the corpus (a 4-token file read
    # 1,024 times); raise it for a deliberate overfitting test.
    max_epochs: float = 100.0

    def train_blend(self) -> list[tuple[str, float]]:
        """``(prefix, weight)`` per train prefix, the blend the run trains on (weight 1 for each when
        ``train_weights`` is null; their count and sign are checked at load, ``validate_data``).
        An empty ``train_prefixes`` is an error here, not at load: a config read only for its model
        (the exporter, the tools) needs no data."""
        if not self.train_prefixes:
            raise LoopConfigError("data.train_prefixes: empty; expected at least one indexed dataset prefix "
                                  "(P for P.bin/P.idx, written by tools/preprocess_data.py)")
        weights = self.train_weights if self.train_weights is not None else [1.0] * len(self.train_prefixes)
        return [(prefix, float(weight)) for prefix, weight in zip(self.train_prefixes, weights)]

    def validation_prefixes(self) -> list[str]:
        """The prefixes validation reads: ``valid_prefixes``, or by default the train prefix's sibling
        (the one place that falls back to it)."""
        if self.valid_prefixes is not None:
            return list(self.valid_prefixes)
        sibling = sibling_valid_prefix(self.train_prefixes[0]) if self.train_prefixes else None
        return [sibling] if sibling else []

    def validate(self, prefix: str = "data") -> None:
        validate_data(self, prefix)


@dataclass
class LoggingConfig:
    wandb_project: str | None = None
    wandb_run_name: str | None = None
    wandb_mode: str = "auto"  # auto: online with an API key, offline without one
    progress_bar: bool = True
    # TensorBoard event files in OUTPUT_DIR/tensorboard (the same scalars as metrics.jsonl).
    tensorboard: bool = False
    # Per-device peak FLOP/s (in TFLOP/s) for the MFU estimate; null: 989 (H100/H200 dense
    # bf16) on GPU, no MFU on CPU (a measured matmul rate moves with the machine's load).
    peak_tflops: float | None = None
    # Loop dynamics (training/dynamics.py) every N steps on the first held-out batch: per-loop state
    # norms and relative updates, the loss at r = K - 1, K, K + 1, the timestep gates; 0 = off.
    dynamics_interval: int = 250

    def validate(self, prefix: str = "logging") -> None:
        validate_logging(self, prefix)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # tensor parallelism: config/parallel.py
    source: str | None = None  # the YAML it came from (for messages)

    def validate(self) -> None:
        validate_config(self)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "logging": LoggingConfig,
            "parallel": ParallelConfig}
