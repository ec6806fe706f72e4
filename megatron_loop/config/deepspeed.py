"""The DeepSpeed JSON (``train.deepspeed_config``): its one owner. Where the file is
(:func:`locate`), reading it (:func:`read_run_json`; the shipped stages: :func:`read_ds_config`),
checking it against the YAML and filling its ``"auto"`` values (:func:`resolve_ds_config`, App. C.2
batch arithmetic and clipping), the settings of one start, read and resolved once
(:class:`DeepSpeedSettings`, what the preflight checks, the start-up statement, the dry run, the memory
check, the ranks' agreement and :func:`megatron_loop.optim.build_engine` are given), its ZeRO stage (:func:`zero_stage`) and the copy that loads a universal checkpoint
(:func:`with_universal_load`). This module imports no torch: ``pretrain_loop.py --dry-run`` runs the
same resolution the engine is given.

Who decides what, when both files speak:

* batch sizes: the YAML (``train.micro_batch_size``, ``train.global_batch_size``; the accumulation
  is derived). The JSON's ``train_batch_size``, ``train_micro_batch_size_per_gpu`` and
  ``gradient_accumulation_steps`` must be ``"auto"`` (the shipped files) or the same numbers;
* gradient clipping: ``train.grad_clip``; the JSON's ``gradient_clipping`` ``"auto"`` or the same;
* precision: ``train.precision`` when it is ``bf16`` or ``fp32``; with ``train.precision: auto`` the
  JSON's ``bf16.enabled`` decides when it is ``true``/``false``, and its ``"auto"`` means bf16 with
  CUDA, fp32 without. An explicit JSON value that contradicts an explicit ``train.precision`` is
  refused; ``fp16`` is refused (the code trains in bf16 or fp32);
* optimizer and schedule: the code (Muon + AdamW, WSD); an ``optimizer`` or ``scheduler`` block is
  refused;
* ZeRO: the JSON's ``zero_optimization.stage`` (0-3); offloading is refused;
* gradient accumulation precision: a bf16 run needs ``data_types.grad_accum_dtype`` (``"fp32"`` in
  the shipped files; ``"bf16"`` accepts bf16 sums explicitly), see :func:`check_precision`.

Every other key (communication buckets, ``data_types``, ``checkpoint``, ...) is DeepSpeed's own
and passed through unchanged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from megatron_loop.errors import LoopConfigError

# The shipped zero{0..3}.json: a relative train.deepspeed_config not found from the working
# directory is looked up here (the run config read back from anywhere still finds them).
CONFIG_DIR = Path(__file__).resolve().parents[2] / "deepspeed_configs"

AUTO = "auto"
ACCUMULATION_KEY = "data_types.grad_accum_dtype"
COMMUNICATION_KEY = "communication_data_type"
# DeepSpeed's DtypeEnum spellings (deepspeed/runtime/config.py), without importing torch.
DTYPE_ALIASES = {
    "fp32": ("fp32", "float32", "float", "torch.float32"),
    "bf16": ("bf16", "bfloat16", "torch.bfloat16"),
    "fp16": ("fp16", "float16", "half", "torch.float16"),
    "int8": ("int8", "torch.int8"),
}


def dtype_name(value, source: str = "DeepSpeed config") -> str | None:
    """DeepSpeed's name of a dtype (``"fp32"``, ``"bf16"``, ...) for any alias it accepts; None if unset."""
    if value is None:
        return None
    for name, aliases in DTYPE_ALIASES.items():
        if str(value) in aliases:
            return name
    raise LoopConfigError(f"{source}: {ACCUMULATION_KEY}={value!r}: expected 'fp32' or 'bf16'")


def check_precision(config: dict, bf16: bool, source: str = "DeepSpeed config") -> None:
    """Refuse a bf16 run whose micro-batch gradients DeepSpeed would sum in bf16 without being asked.

    DeepSpeed 0.19 sums micro-batch gradients in the weights' dtype unless
    ``data_types.grad_accum_dtype`` says otherwise (ZeRO 1 then builds its BF16_Optimizer with fp32
    gradient buffers, ZeRO 2/3 fp32 gradient partitions). bf16 runs therefore need the key:
    ``"fp32"`` (the shipped configs, as Megatron-LM's ``main_grad``) or ``"bf16"`` to accept bf16
    accumulation explicitly. An unset ``communication_data_type`` follows it, so the data-parallel
    sum is in the same precision as the micro-batch sum.
    """
    accumulation = dtype_name((config.get("data_types") or {}).get("grad_accum_dtype"), source)
    if bf16 and accumulation is None:
        raise LoopConfigError(
            f"{source}: sets no {ACCUMULATION_KEY}: a bf16 run would sum the micro-batch gradients in "
            f"bf16; set it to \"fp32\" (as deepspeed_configs/zero*.json) or to \"bf16\" to accept bf16 accumulation")
    allowed = ("fp32", "bf16") if bf16 else ("fp32", None)
    if accumulation not in allowed:
        expected = "'fp32' or 'bf16'" if bf16 else "'fp32' (or unset) in an fp32 run"
        raise LoopConfigError(f"{source}: {ACCUMULATION_KEY}={accumulation!r}: expected {expected}")
    if bf16:
        config.setdefault(COMMUNICATION_KEY, accumulation)


def precision_choice(config: dict, bf16: bool | None, cuda: bool | None) -> tuple[bool | None, str]:
    """(bf16 or not, which side decided): ``bf16`` is the YAML's choice (None: ``train.precision: auto``);
    ``cuda`` None leaves an all-``auto`` choice open (the dry run, which imports no torch)."""
    given = (config.get("bf16") or {}).get("enabled", AUTO)
    if bf16 is not None:
        return bf16, "train.precision"
    if given != AUTO:
        return bool(given), "bf16.enabled of train.deepspeed_config"
    if cuda is None:
        return None, "train.precision auto and bf16.enabled auto: bf16 with CUDA, fp32 without"
    return cuda, "auto: bf16 with CUDA, fp32 without"


def resolve_ds_config(
    config: dict,
    *,
    micro_batch_size: int,
    grad_accum: int,
    data_parallel_size: int,
    bf16: bool | None,
    grad_clip: float,
    source: str = "DeepSpeed config",
    cuda: bool | None = None,
) -> dict:
    """Check ``config`` against the run and fill DeepSpeed's ``"auto"`` values (see the module doc).

    ``train_batch_size = micro_batch_size * grad_accum * data_parallel_size`` (App. C.2: 38 x 6 x 8
    = 1,824). ``bf16`` is the YAML's precision (None for ``auto``); ``cuda`` whether a GPU is there
    (None: unknown, the dry run: bf16 stays ``"auto"`` when nothing decides it). Gradient clipping
    goes to ZeRO (stage >= 1, raw gradients) or to the optimizer (stage 0), see ``build_engine``.
    ``source`` names the file in messages.
    """
    config = json.loads(json.dumps(config))
    for key in ("optimizer", "scheduler"):
        if key in config:
            raise LoopConfigError(f"{source}: sets {key!r}; expected no {key!r} block: the optimizer (Muon + "
                                  "AdamW) and the WSD schedule come from the YAML's train.* settings")
    if min(micro_batch_size, grad_accum, data_parallel_size) < 1:
        raise LoopConfigError("micro_batch_size, grad_accum and data-parallel size must be >= 1")
    wanted = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch_size * grad_accum * data_parallel_size,
    }
    for key, value in wanted.items():
        given = config.get(key, AUTO)
        if given != AUTO and given != value:
            raise LoopConfigError(
                f"{source}: {key}={given} disagrees with micro {micro_batch_size} x accum {grad_accum} x "
                f"data-parallel {data_parallel_size} (= global {wanted['train_batch_size']}); the YAML's "
                "train.global_batch_size and train.micro_batch_size decide: set \"auto\" in the JSON")
        config[key] = value
    zero = config.setdefault("zero_optimization", {})
    if not isinstance(zero, dict):
        raise LoopConfigError(f"{source}: zero_optimization={zero!r}; expected a JSON object")
    stage = zero.setdefault("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise LoopConfigError(f"{source}: zero_optimization.stage={stage!r}; expected a ZeRO stage 0, 1, 2 or 3")
    for key in ("offload_optimizer", "offload_param"):
        device = (zero.get(key) or {}).get("device", "none")
        if device not in (None, "none"):
            # Muon gathers whole matrices on the partitions' device; offloaded partitions are untested
            raise LoopConfigError(f"{source}: zero_optimization.{key}.device={device!r}: offloading is not "
                                  "supported with the Muon optimizer; expected \"none\" or no offload block")
    fp16 = (config.get("fp16") or {}).get("enabled", False)
    if fp16 not in (False, AUTO):
        raise LoopConfigError(f"{source}: fp16.enabled={json.dumps(fp16)}: fp16 training is not supported; "
                              "expected it false or absent (train.precision chooses bf16 or fp32)")
    given = (config.get("bf16") or {}).get("enabled", AUTO)
    if bf16 is not None and given != AUTO and bool(given) != bf16:
        raise LoopConfigError(
            f"{source}: bf16.enabled={json.dumps(given)} disagrees with train.precision="
            f"{'bf16' if bf16 else 'fp32'!r}; train.precision decides: set bf16.enabled to \"auto\" in the JSON, "
            "or train.precision: auto to let the JSON decide")
    bf16, _ = precision_choice(config, bf16, cuda)
    if bf16 and stage == 0:
        # DeepSpeed wraps bf16 at stage 0 in its own optimizers; use ZeRO 1 (same maths).
        raise LoopConfigError(f"{source}: bf16 needs ZeRO stage >= 1 (use deepspeed_configs/zero1.json)")
    config["bf16"] = {**(config.get("bf16") or {}), "enabled": AUTO if bf16 is None else bool(bf16)}
    config["fp16"] = {**(config.get("fp16") or {}), "enabled": False}
    if bf16 is not None:
        check_precision(config, bool(bf16), source)
    given_clip = config.get("gradient_clipping", AUTO)
    if given_clip != AUTO and (isinstance(given_clip, bool) or not isinstance(given_clip, (int, float))
                               or float(given_clip) != float(grad_clip)):
        raise LoopConfigError(f"{source}: gradient_clipping={given_clip} disagrees with train.grad_clip={grad_clip}; "
                              "train.grad_clip decides: set \"auto\" in the JSON")
    # stage >= 1: ZeRO clips the raw gradient partitions with one global norm; stage 0: the
    # optimizer clips (DeepSpeed's stage-0 clip would not report the norm).
    config["gradient_clipping"] = float(grad_clip) if stage >= 1 else 0.0
    config["zero_allow_untested_optimizer"] = True
    return config


def locate(path: str | os.PathLike, base: str | os.PathLike | None = None) -> str:
    """``path`` made absolute: from ``base`` (default: the working directory) when a file is there,
    else from the repository (the shipped ``deepspeed_configs/``); as written when neither exists (the
    check that reports it names what the user wrote)."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return str(p)
    here = Path(os.getcwd() if base is None else base) / p
    if here.is_file():
        return os.path.normpath(here)
    shipped = CONFIG_DIR.parent / p
    return str(shipped) if shipped.is_file() else str(path)


def read_ds_config(source: str | os.PathLike | dict | None = None, zero_stage: int | None = None) -> dict:
    """A DeepSpeed config as a dict: ``source`` (a file or a dict, copied) or, without one, the shipped
    ``deepspeed_configs/zero{zero_stage}.json`` (stage 0: ``{"zero_optimization": {"stage": 0}}``)."""
    if source is None:
        if zero_stage is None:
            raise LoopConfigError("give zero_stage or ds_config")
        if zero_stage == 0:
            return {"zero_optimization": {"stage": 0}}
        source = CONFIG_DIR / f"zero{zero_stage}.json"
    if isinstance(source, dict):
        config = json.loads(json.dumps(source))  # deep copy
    else:
        path = Path(locate(source))
        if not path.is_file():
            raise LoopConfigError(f"DeepSpeed config {path} not found")
        config = json.loads(path.read_text())
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if zero_stage is not None and stage != zero_stage:
        raise LoopConfigError(f"DeepSpeed config has ZeRO stage {stage}, expected {zero_stage}")
    return config


def zero_stage(config: dict) -> int:
    """The ZeRO stage a DeepSpeed config asks for (0 when it names none)."""
    return int((config.get("zero_optimization") or {}).get("stage", 0))


def with_universal_load(config: dict) -> dict:
    """``config`` with ``checkpoint.load_universal`` on: DeepSpeed then re-partitions a universal
    checkpoint over this world (a resume on another number of data-parallel ranks)."""
    return {**config, "checkpoint": {**config.get("checkpoint", {}), "load_universal": True}}


def read_run_json(path: str) -> dict:
    """``train.deepspeed_config`` as the JSON object it holds; a missing file or one that is not a JSON
    object is one ``error:`` line naming the key. A start reads it here once
    (:meth:`DeepSpeedSettings.of_run`)."""
    if not os.path.isfile(path):
        raise LoopConfigError(f"train.deepspeed_config={path!r}: file not found (relative paths are taken from "
                              f"{os.getcwd()}, then the repository); expected e.g. deepspeed_configs/zero1.json")
    try:
        with open(path) as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON {type(raw).__name__}")
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise LoopConfigError(f"train.deepspeed_config={path!r}: not a DeepSpeed JSON config ({e}); expected a JSON "
                              "object like deepspeed_configs/zero1.json") from None
    return raw


def _precision_name(bf16: bool | None) -> str:
    return "auto" if bf16 is None else "bf16" if bf16 else "fp32"


@dataclass(frozen=True)
class DeepSpeedSettings:
    """The DeepSpeed settings of one start: the JSON read once and resolved once against the run
    (:func:`resolve_ds_config`), then handed whole to the preflight checks, the start-up statement, the
    dry run, the memory check, the ranks' agreement and :func:`megatron_loop.optim.build_engine` (which
    takes nothing else). Made by :meth:`of_run` (a run's YAML) or :meth:`resolve` (a JSON in hand: the
    shipped stages of tests and benchmarks). ``raw`` and ``resolved`` are private copies; read
    :meth:`engine_config` for a dict to hand on."""

    path: str | None  # train.deepspeed_config as given (made absolute by load_config); None: a dict in hand
    raw: dict  # the JSON as read (what every rank must hold the same of: training/agreement.py)
    resolved: dict  # DeepSpeed's config with every "auto" filled: batch sizes, clipping, precision, ZeRO
    micro_batch_size: int
    grad_accum: int
    data_parallel_size: int
    grad_clip: float
    precision: str  # "bf16" or "fp32"; "auto" only when no device was known (the dry run imports no torch)
    precision_from: str  # which side chose it (train.precision, the JSON's bf16.enabled, or auto)

    @property
    def zero_stage(self) -> int:
        return zero_stage(self.resolved)

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"

    @classmethod
    def resolve(cls, raw: dict, *, micro_batch_size: int, grad_accum: int, data_parallel_size: int,
                bf16: bool | None, grad_clip: float, cuda: bool | None = None,
                path: str | None = None) -> "DeepSpeedSettings":
        """``raw`` checked against the run and resolved (:func:`resolve_ds_config`); ``cuda`` None (the dry
        run) leaves a precision that nothing decides ``"auto"``."""
        source = f"train.deepspeed_config={path!r}" if path is not None else "DeepSpeed config"
        raw = json.loads(json.dumps(raw))  # a private copy: the caller's dict may change later
        resolved = resolve_ds_config(raw, micro_batch_size=micro_batch_size, grad_accum=grad_accum,
                                     data_parallel_size=data_parallel_size, bf16=bf16, grad_clip=grad_clip,
                                     source=source, cuda=cuda)
        chosen, by = precision_choice(raw, bf16, cuda)
        return cls(path=path, raw=raw, resolved=resolved, micro_batch_size=micro_batch_size, grad_accum=grad_accum,
                   data_parallel_size=data_parallel_size, grad_clip=float(grad_clip),
                   precision=_precision_name(chosen), precision_from=by)

    @classmethod
    def of_run(cls, cfg, accumulation: int, data_parallel_size: int, cuda: bool | None = None) -> "DeepSpeedSettings":
        """``train.deepspeed_config`` of the run ``cfg`` read (:func:`read_run_json`) and resolved against its
        YAML at ``accumulation`` micro-batches per rank over ``data_parallel_size`` ranks. ``cuda``: whether
        this process trains on a GPU (None: the dry run, which imports no torch)."""
        t = cfg.train
        return cls.resolve(read_run_json(t.deepspeed_config), micro_batch_size=t.micro_batch_size,
                           grad_accum=accumulation, data_parallel_size=data_parallel_size,
                           bf16=None if t.precision == "auto" else t.precision == "bf16", grad_clip=t.grad_clip,
                           cuda=cuda, path=t.deepspeed_config)

    def engine_config(self) -> dict:
        """A copy of the resolved config: what ``deepspeed.initialize`` is given."""
        return json.loads(json.dumps(self.resolved))

    def with_universal_load(self) -> "DeepSpeedSettings":
        """These settings loading a universal checkpoint (:func:`with_universal_load`)."""
        return replace(self, resolved=with_universal_load(self.resolved))

    def report(self) -> dict:
        """What ``--dry-run`` reports of it: the file, the ZeRO stage, the precision and which side chose it."""
        return {"deepspeed_config": self.path, "zero_stage": self.zero_stage, "precision": self.precision,
                "precision_from": self.precision_from}
