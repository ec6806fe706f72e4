"""Resume that checks what changed since the checkpoint: applied, applied through a universal copy, or refused.

Every checkpoint's manifest holds the settings of the run that wrote it (:func:`run_settings`:
the resolved config, the data it trained on, the ZeRO stage and the number of data-parallel
ranks). A resume compares them with the new config before DeepSpeed reads a byte
(:func:`decide_resume`):

* applied exactly, and logged: the schedule (``train.lr``, ``max_steps``, ``train_tokens``,
  ``tokens_per_parameter``, the WSD fractions and ``min_lr_ratio``: the WSD split is re-derived
  for the new total; from a checkpoint in its decay the decay goes on from its rate by default
  (``train.schedule_on_resume: continue_decay``; ``rewarm`` goes back up to the peak), and one short
  line states the lr of the next update, :func:`apply_decision`) and the optimizer
  hyperparameters (weight decay, betas, eps, Muon momentum / Nesterov / Newton-Schulz steps /
  scale, ``grad_clip``), which DeepSpeed would otherwise restore from the checkpoint;
* applied through DeepSpeed's universal checkpoint: another number of data-parallel ranks under
  ZeRO 1/2 (:mod:`megatron_loop.checkpoint.universal`); stage 0 holds whole tensors anyway;
* refused with one line naming the key: the architecture (``model:`` without execution keys),
  ``train.seq_length``, ``train.global_batch_size``, ``train.seed`` (each fixes which tokens a step
  reads), ``train.precision`` and the ZeRO stage (different optimizer state layouts), the training
  data (sizes, weights and a sampled content hash), the tokenizer's files (a folder retrained in
  place), and another data-parallel size under ZeRO 3;
* ignored: ``train.init_from`` / ``init_from_missing``, a fresh start's source of weights
  (:mod:`megatron_loop.training.init_from`), already in the checkpoint's weights;
* everything else (intervals, retention, validation, logging, workers, paths) simply takes effect.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from megatron_loop.checkpoint.folders import MANIFEST
from megatron_loop.checkpoint.manifest import EXECUTION_KEYS, model_signature
from megatron_loop.checkpoint.selection import SelectedCheckpoint
from megatron_loop.config import Config
from megatron_loop.data.indexed import content_fingerprint
from megatron_loop.data.tokenizer import tokenizer_fingerprint
from megatron_loop.errors import LoopConfigError
from megatron_loop.checkpoint.tensor_parallel import check_resume as check_tensor_parallel_resume

SCHEDULE_KEYS = ("train.lr", "train.max_steps", "train.train_tokens", "train.tokens_per_parameter",
                 "train.warmup_fraction", "train.stable_fraction", "train.min_lr_ratio", "train.schedule_on_resume")
OPTIMIZER_KEYS = ("train.weight_decay", "train.adam_beta1", "train.adam_beta2", "train.adam_eps",
                  "train.muon_momentum", "train.muon_nesterov", "train.muon_ns_steps", "train.muon_scale",
                  "train.grad_clip")
REFUSED = {
    "train.seq_length": "the data position counts sequences of seq_length tokens, so the rest of the run "
                        "would replay or skip data",
    "train.global_batch_size": "steps, the schedule and the data position of every step are counted in "
                               "global batches",
    "train.seed": "the seed fixes the document order of the packed data, so the rest of the run would read "
                  "another order",
    "train.precision": "fp32 and bf16 runs keep different ZeRO optimizer states",
    # Ouro's Stage II freezes every parameter but the exit gate's: its optimizer holds other parameters
    "train.exit_gate_objective": "Ouro's Stage II (adaptive_gate) trains the exit gate only, so its optimizer "
                                 "state covers other parameters than Stage I's (Stage II starts from Stage I's "
                                 "weights in a new train.output_dir with train.init_from naming Stage I's checkpoints)",
}
# Keys of a fresh start only (training/init_from.py): a resume reads its own checkpoint, whatever they say.
START_ONLY_KEYS = ("train.init_from", "train.init_from_missing")
REWARM = "train.schedule_on_resume=rewarm"  # the lr jump back to the peak, by name only


def data_fingerprint(cfg: Config) -> list[dict[str, Any]]:
    """What the training data is, independently of where it lives: name, size, weight and a content
    hash (:func:`megatron_loop.data.indexed.content_fingerprint`) of each prefix."""
    weights = cfg.data.train_weights or [1.0] * len(cfg.data.train_prefixes)
    out = []
    for prefix, weight in zip(cfg.data.train_prefixes, weights):
        bin_file = Path(prefix + ".bin")
        present = bin_file.is_file() and Path(prefix + ".idx").is_file()
        out.append({"prefix": prefix, "name": bin_file.name, "weight": float(weight),
                    "bytes": bin_file.stat().st_size if bin_file.is_file() else None,
                    "content_sha256": content_fingerprint(prefix) if present else None})
    return out


def run_settings(cfg: Config, world_size: int, zero_stage: int) -> dict[str, Any]:
    """The settings a checkpoint records for the next resume to compare (manifest fields)."""
    return {"world_size": world_size, "zero_stage": zero_stage, "config": cfg.to_dict(),
            "data": data_fingerprint(cfg), "tokenizer": tokenizer_fingerprint(cfg.data.tokenizer)}


@dataclass
class ResumeDecision:
    universal: bool = False  # another data-parallel size: load through the universal layout
    schedule: list[str] = field(default_factory=list)  # "train.lr 0.003 -> 0.001", ...
    optimizer: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # take effect without touching the state

    def summary(self, saved_world: int | None, world: int) -> list[str]:
        lines = []
        if self.universal:
            lines.append(f"resume: {saved_world} -> {world} data-parallel ranks: loading through DeepSpeed's "
                         "universal checkpoint (weights, Muon momentum, AdamW moments re-partitioned)")
        if self.schedule or self.optimizer:
            lines.append("resume: applying changed settings: " + "; ".join(self.schedule + self.optimizer))
        if self.other:
            lines.append("resume: changed settings that take effect now: " + "; ".join(self.other))
        return lines


def _flat(section: str, values: dict) -> dict[str, Any]:
    return {f"{section}.{k}": v for k, v in values.items()}


def _show(value: Any) -> str:
    return json.dumps(value)


def decide_resume(point: SelectedCheckpoint, cfg: Config, world_size: int, zero_stage: int) -> ResumeDecision:
    """Compare the checkpoint's settings with ``cfg``; refuse (:class:`LoopConfigError`, one line
    naming the key) or return what to apply."""
    manifest = point.manifest or {}
    where = point.path / MANIFEST
    tp = cfg.parallel.tensor_model_parallel_size
    check_tensor_parallel_resume(point.manifest, where, tp, world_size // tp)
    saved_model = manifest.get("model", {})
    # a key newer than the checkpoint (model.loop_norm, ...): the checkpoint ran its default
    defaults = {f.name: f.default for f in fields(cfg.model) if f.default is not MISSING}
    for key, value in model_signature(cfg).items():
        saved_value = saved_model.get(key, defaults.get(key)) if saved_model else saved_model.get(key)
        if saved_value != value:
            raise LoopConfigError(
                f"{where}: checkpoint is for a different architecture: model.{key}={saved_value!r} "
                f"in the checkpoint, {value!r} in the config")
    saved_stage = manifest.get("zero_stage", 0)
    if saved_stage != zero_stage:
        raise LoopConfigError(
            f"{where}: written with ZeRO stage {saved_stage}, resumed with stage {zero_stage} "
            f"(train.deepspeed_config={cfg.train.deepspeed_config!r}); the optimizer states are laid out "
            f"differently: resume with a stage-{saved_stage} DeepSpeed config")
    decision = ResumeDecision()
    saved_world = manifest.get("world_size", world_size)
    if saved_world != world_size and zero_stage >= 1:
        if zero_stage == 3:
            raise LoopConfigError(
                f"{where}: written by {saved_world} data-parallel ranks, resumed with {world_size}; a ZeRO 3 "
                f"checkpoint resumes only on {saved_world} ranks (ZeRO 1/2 checkpoints convert through "
                "DeepSpeed's universal checkpoint)")
        decision.universal = True
    saved = manifest.get("config")
    if saved is None:  # written before checkpoints recorded their settings
        return decision
    current = cfg.to_dict()
    old = {**_flat("train", saved.get("train", {})), **_flat("data", saved.get("data", {})),
           **_flat("logging", saved.get("logging", {}))}
    new = {**_flat("train", current["train"]), **_flat("data", current["data"]),
           **_flat("logging", current["logging"])}
    for key in sorted(new):
        if key not in old or old[key] == new[key] or key in START_ONLY_KEYS:
            continue
        change = f"{key} {_show(old[key])} -> {_show(new[key])}"
        if key in REFUSED:
            raise LoopConfigError(
                f"{where}: {key}={_show(old[key])} in the checkpoint, {_show(new[key])} in the config: "
                f"{REFUSED[key]}; resume with --set {key}={_show(old[key])} or start a new train.output_dir")
        if key in SCHEDULE_KEYS:
            decision.schedule.append(change)
        elif key in OPTIMIZER_KEYS:
            decision.optimizer.append(change)
        elif key not in ("data.train_prefixes", "data.train_weights"):
            decision.other.append(change)
    for key in EXECUTION_KEYS:
        before, after = saved.get("model", {}).get(key), current["model"].get(key)
        if key in saved.get("model", {}) and before != after:
            decision.other.append(f"model.{key} {_show(before)} -> {_show(after)}")
    _check_data(where, manifest.get("data"), data_fingerprint(cfg), decision)
    _check_tokenizer(where, manifest.get("tokenizer"), tokenizer_fingerprint(cfg.data.tokenizer))
    return decision


def _check_tokenizer(where: Path, saved: dict | None, current: dict | None) -> None:
    """The same tokenizer files (by content, wherever the folder now is): a folder retrained in
    place gives the same token ids other text, and the next save would record the new hash, so
    the export's own check (``export/convert.check_tokenizer_identity``) would then pass it."""
    if not saved or not current or not saved.get("sha256") or not current.get("sha256"):
        return  # a hub name (recorded by name; a changed name is a changed data.tokenizer), or none
    if saved["sha256"] != current["sha256"]:
        raise LoopConfigError(
            f"{where}: data.tokenizer={current['name']!r}: other files than the tokenizer the checkpoint trained "
            f"with (sha256 of its files: {saved['sha256'][:12]} then ({saved.get('name')}), {current['sha256'][:12]} "
            "now); its token ids would mean other text: resume with the tokenizer of training or start a new "
            "train.output_dir")


def _check_data(where: Path, saved: list | None, current: list, decision: ResumeDecision) -> None:
    """Same files (by name, size and sampled content) and weights: the data position stays meaningful."""
    if saved is None:
        return
    describe = [(d["name"], d["bytes"], d["weight"]) for d in current]
    if [(d["name"], d["bytes"], d["weight"]) for d in saved] != describe:
        was = ", ".join(f"{d['prefix']} ({d['bytes']} bytes, weight {d['weight']})" for d in saved)
        now = ", ".join(f"{d['prefix']} ({d['bytes']} bytes, weight {d['weight']})" for d in current)
        raise LoopConfigError(
            f"{where}: data.train_prefixes/train_weights differ: the checkpoint trained on {was}, the config "
            f"names {now}; the data position would point into other data: resume with the same data "
            "or start a new train.output_dir")
    for a, b in zip(saved, current):
        if a.get("content_sha256") and b.get("content_sha256") and a["content_sha256"] != b["content_sha256"]:
            raise LoopConfigError(
                f"{where}: {b['prefix']}.bin/.idx: same name and size ({b['bytes']} bytes) but other content than "
                f"the checkpoint trained on (sha256 of the index and sampled blocks: {a['content_sha256'][:12]} "
                f"then, {b['content_sha256'][:12]} now); the data position would point into other data: resume "
                "with the original data or start a new train.output_dir")
    moved = [f"{a['prefix']} -> {b['prefix']}" for a, b in zip(saved, current) if a["prefix"] != b["prefix"]]
    if moved:
        decision.other.append("data.train_prefixes moved (same files by name and size): " + ", ".join(moved))


@dataclass
class Hyperparameters:
    """The optimizer and schedule settings of a freshly built engine (the new config)."""

    groups: list[dict]
    base_lrs: list[float]
    lambdas: list[dict]

    @classmethod
    def of(cls, engine, optimizer) -> "Hyperparameters":
        sched = engine.lr_scheduler
        return cls([{k: v for k, v in g.items() if k not in ("params", "lr", "initial_lr")}
                    for g in optimizer.param_groups],
                   list(sched.base_lrs), [dict(vars(fn)) for fn in sched.lr_lambdas])


def apply_decision(engine, optimizer, fresh: Hyperparameters, decision: ResumeDecision, mode: str = "continue_decay",
                   kept: list[tuple[int, str]] = ()) -> str | None:
    """After DeepSpeed restored the checkpoint's optimizer and schedule: put the new config's
    settings back where they changed. ``mode`` is ``train.schedule_on_resume``; ``kept``: the
    ``(step, tag)`` of the run's checkpoints (the re-warm line names a stable-phase one).
    Returns one short line with the lr of the next update and what the schedule does from there
    (or None: the schedule is unchanged)."""
    if decision.optimizer:
        for group, values in zip(optimizer.param_groups, fresh.groups):
            group.update(values)
    if not decision.schedule:
        return None
    sched = engine.lr_scheduler
    done = sched.last_epoch  # updates done: the checkpoint's last update ran at lambda(done - 1)
    old = sched.lr_lambdas[0]
    old_split, old_value = dict(vars(old)), old(done - 1) if done > 0 else 0.0
    was_decaying = done > 0 and old.in_decay(done)
    sched.base_lrs = list(fresh.base_lrs)
    for fn, values in zip(sched.lr_lambdas, fresh.lambdas):
        vars(fn).update(values)
        if mode == "continue_decay" and was_decaying:  # decay on from where the checkpoint stopped
            fn.decay_from_step, fn.decay_from_value = done, old_value
    for group, base, fn in zip(optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
        group["initial_lr"] = base
        group["lr"] = base * fn(done)
    sched._last_lr = [g["lr"] for g in optimizer.param_groups]
    return schedule_line(sched.lr_lambdas[0], done, optimizer.param_groups[0]["lr"], old_value, was_decaying,
                         old_split["warmup"] + old_split["stable"], kept)


def schedule_line(new, done: int, lr: float, old_value: float, was_decaying: bool, last_stable: int,
                  kept: list[tuple[int, str]] = ()) -> str:
    """``resume: lr of update N: X, ...``: the rate of the next update and where the re-derived
    schedule ``new`` (a :class:`~megatron_loop.optim.schedule.WSDMultiplier`) goes from there.
    ``old_value``: the multiplier the checkpoint's last update ran at; ``last_stable``: the last
    update of the checkpoint's stable phase."""
    head = f"resume: lr of update {done + 1}: {lr:.3g}"
    if new.decay_from_step is not None:
        if old_value <= new.final:  # the decay had already ended: the rate stays at its floor
            return f"{head}, the decay's final {new.final:g} x peak, held to update {new.total} ({REWARM} re-warms)"
        return f"{head}, continuing the decay to {new.final:g} x peak at update {new.total} ({REWARM} re-warms)"
    if was_decaying and new(done) > old_value:  # asked for by name: a stable-phase checkpoint decays over the new end
        stable = [tag for step, tag in sorted(kept, reverse=True) if 0 < step <= last_stable]
        return (f"{head}, re-warmed from {old_value:.3g} to {new(done):.3g} x peak ({REWARM}; stable-phase "
                f"checkpoint: {stable[0] if stable else 'none kept'})")
    if new.in_decay(done + 1):
        return f"{head}, decaying to {new.final:g} x peak at update {new.total}"
    # the WSD way: the stable phase is prolonged, the decay runs over the new end
    return f"{head}, stable phase; the decay runs over updates {new.warmup + new.stable + 1}-{new.total}"
