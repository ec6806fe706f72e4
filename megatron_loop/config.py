"""Typed, validated configuration: YAML -> dataclasses, ``--set key.path=value`` overrides.

The ``model:`` section uses the HF export vocabulary of SPEC.md (``prelude_layers``,
``core_layers``, ``train_loops``, ``coda_layers``, ``initial_injection``, ...), plus
``backbone`` (a preset from App. A.1 whose fields the others override) and
``activation_checkpointing``. Every error names the key and what was expected.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from megatron_loop.errors import LoopConfigError

# --------------------------------------------------------------------------------------
# Backbone presets (App. A.1, Table 5)
# --------------------------------------------------------------------------------------

LLAMA3_ROPE_SCALING = {
    # Llama 3 RoPE scaling rule (App. A.1): original context 8,192, max context 131,072.
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
CHECKPOINTING = ("none", "per_loop", "per_block")


# --------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    """Architecture ``p+s×K+c`` and the conditioning mechanisms (Sec. 2.1, Sec. 4, App. A.1)."""

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
    activation_checkpointing: str = "per_loop"
    # torch.compile each transformer block once (static shapes) and reuse it at every loop:
    # changing r never recompiles (megatron_loop/perf.py). Off by default: compiling costs
    # start-up time and needs a C++ compiler on CPU; it pays on GPU (docs/BENCHMARKS.md).
    compile: bool = False

    # ---- derived quantities (App. A.1 "BaseLoop and CoreLoop models")
    @property
    def physical_depth(self) -> int:
        return self.prelude_layers + self.core_layers + self.coda_layers

    def effective_depth(self, num_loops: int | None = None) -> int:
        r = self.train_loops if num_loops is None else num_loops
        return self.prelude_layers + r * self.core_layers + self.coda_layers

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
        need(self.timestep in TIMESTEPS, "timestep", f"one of {TIMESTEPS}")
        need(self.timestep_grid in TIMESTEP_GRIDS, "timestep_grid", f"one of {TIMESTEP_GRIDS}")
        need(self.activation_checkpointing in CHECKPOINTING, "activation_checkpointing", f"one of {CHECKPOINTING}")
        if self.rope_scaling is not None:
            need(self.rope_scaling.get("rope_type") == "llama3", "rope_scaling",
                 "null or a llama3 rule {rope_type: llama3, factor, low_freq_factor, high_freq_factor, "
                 "original_max_position_embeddings}")
            for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
                need(k in self.rope_scaling, "rope_scaling", f"a llama3 rule with key {k!r}")


@dataclass
class TrainConfig:
    """Training recipe (App. A.2, Table 7)."""

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
        need(self.muon_scale in ("match_rms_adamw", "original"), "muon_scale", "'match_rms_adamw' or 'original'")
        need(self.muon_ns_steps >= 1, "muon_ns_steps", "an integer >= 1")
        need(self.grad_clip > 0, "grad_clip", "a positive float")
        need(self.train_tokens is None or self.train_tokens > 0, "train_tokens", "null or a positive integer")
        need(self.max_steps is None or self.max_steps >= 1, "max_steps", "null or a positive integer")
        need(self.precision in ("auto", "bf16", "fp32"), "precision", "'auto', 'bf16' or 'fp32'")
        need(self.save_interval >= 1, "save_interval", "a positive integer")
        need(self.keep_last >= 1, "keep_last", "a positive integer")
        need(self.log_interval >= 1, "log_interval", "a positive integer")
        need(self.eval_interval >= 0, "eval_interval", "an integer >= 0 (0 disables periodic validation)")
        need(self.eval_loops is None or all(r >= 1 for r in self.eval_loops), "eval_loops",
             "null or a list of loop counts >= 1")
        need(self.nan_policy in ("skip", "stop"), "nan_policy", "'skip' or 'stop'")
        need(self.max_consecutive_nonfinite >= 1, "max_consecutive_nonfinite", "a positive integer")
        need(self.wall_time_limit_s is None or self.wall_time_limit_s > 0, "wall_time_limit_s",
             "null or a positive number of seconds")
        need(self.exit_interval is None or self.exit_interval >= 1, "exit_interval", "null or a positive integer")
        need(self.collective_timeout_s > 0, "collective_timeout_s", "a positive number of seconds")


@dataclass
class DataConfig:
    """Indexed-dataset prefixes (App. A.1 "Pretraining data and tokenization")."""

    train_prefixes: list[str] = field(default_factory=list)
    train_weights: list[float] | None = None
    valid_prefixes: list[str] = field(default_factory=list)
    tokenizer: str | None = None
    num_workers: int = 1

    def validate(self, prefix: str = "data") -> None:
        if self.train_weights is not None and len(self.train_weights) != len(self.train_prefixes):
            raise LoopConfigError(
                f"{prefix}.train_weights: expected one weight per train prefix "
                f"({len(self.train_prefixes)}), got {len(self.train_weights)}")
        if self.train_weights is not None and any(w <= 0 for w in self.train_weights):
            raise LoopConfigError(f"{prefix}.train_weights={self.train_weights}: expected positive weights")
        if self.num_workers < 0:
            raise LoopConfigError(f"{prefix}.num_workers={self.num_workers}: expected an integer >= 0")


@dataclass
class LoggingConfig:
    wandb_project: str | None = None
    wandb_run_name: str | None = None
    wandb_mode: str = "auto"  # auto: online with an API key, offline without one
    progress_bar: bool = True
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
    source: str | None = None  # the YAML it came from (for messages)

    def validate(self) -> None:
        self.model.validate()
        self.train.validate()
        self.data.validate()
        self.logging.validate()
        if self.train.seq_length > self.model.max_position_embeddings:
            raise LoopConfigError(
                f"train.seq_length={self.train.seq_length}: expected at most the model's maximum context "
                f"model.max_position_embeddings={self.model.max_position_embeddings}")
        if self.train.eval_loops is None:
            k = self.model.train_loops
            loops = {max(1, k // 2), k, 2 * k}
            if self.model.timestep != "none" and self.model.timestep_grid == "prefix":
                loops = {r for r in loops if r <= k}  # the prefix grid cannot extrapolate (App. A.1)
            self.train.eval_loops = sorted(loops)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "logging": LoggingConfig}


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
        raise LoopConfigError(f"--set {text!r}: value is not valid YAML ({e})") from None
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
            source=source,
        )
        cfg.validate()
    except LoopConfigError as e:
        raise LoopConfigError(f"{source}: {e}") from None
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (SPEC.md "Config vocabulary"), apply ``key.path=value`` overrides, validate."""
    path = Path(path)
    if not path.is_file():
        raise LoopConfigError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise LoopConfigError(f"{path}: not valid YAML ({e})") from None
    return config_from_dict(raw, source=str(path), overrides=overrides)
