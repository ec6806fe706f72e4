"""Per-step metrics and the console: JSONL always, wandb / TensorBoard when configured, a tqdm bar
and Megatron-style log lines on rank 0.

Only rank 0 writes. ``{output_dir}/metrics.jsonl`` holds one JSON object per line with an
``event`` key: ``train`` (step, loss, lr_muon, lr_adamw, grad_norm, tokens_per_s, mfu, memory,
...), ``eval`` (``val_loss_r{r}`` per loop count), ``start`` (the run's name, label and lr schedule, at
every start and resume: training/banner.py), ``data`` (epochs the run reads of each
prefix), ``summary`` (end of run), and lifecycle events (``resume``, ``checkpoint``,
``nonfinite``, ``stop``). On resume, records past the resumed step are dropped first (a crashed
run may have logged steps that the resumed run replays), so the file is always the trajectory
of the weights on disk. ``tools/plot_metrics.py`` draws it.

The console gets one line per logged step (every ``train.log_interval``), whether or not the
progress bar is on, so SLURM logs read like Megatron-LM's::

    step  10/300 | loss 5.4321 | lr 3.00e-03 | grad norm 1.234 | 12,345 tok/s | MFU 1.23% | mem 0.45 GiB (peak 0.50) | 0.105 s/step

and a line per validation, the data reuse at start and a summary at the end.
"""

from __future__ import annotations

import json
import math
import os
import resource
import secrets
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from megatron_loop.atomic import write_atomic
from megatron_loop.config import Config
from megatron_loop.console import show_progress

METRICS_NAME = "metrics.jsonl"
WANDB_ID_NAME = "wandb_run_id"
TENSORBOARD_DIR = "tensorboard"


def memory_stats() -> dict[str, float]:
    """Accelerator memory (allocated now / peak) on GPU; resident set size on CPU, in GiB."""
    import torch  # here, not at import: preflight (and so --dry-run) imports this module

    gib = 1024**3
    if torch.cuda.is_available():
        return {"mem_gib": torch.cuda.memory_allocated() / gib,
                "mem_peak_gib": torch.cuda.max_memory_allocated() / gib}
    rss = 0.0
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / gib
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / gib  # Linux reports KiB
    return {"mem_gib": rss, "mem_peak_gib": peak}


def numbered_records(text: str) -> list[tuple[int, str, dict[str, Any] | None]]:
    """``(line number, line, record)`` of every line of a metrics file's text; ``record`` is None
    for a line that is not a JSON object (torn by a crash mid-write, or not written by the
    trainer). NaN and Infinity parse (the trainer writes a non-finite loss as such)."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        out.append((number, line, record if isinstance(record, dict) else None))
    return out


def read_records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(line, record)`` of every record of a metrics file, in order. Tolerant: a line torn by a
    crash mid-write, or anything that is not a JSON object, is skipped."""
    return [(line, record) for _, line, record in numbered_records(path.read_text()) if record is not None]


def record_step(record: dict[str, Any]) -> int:
    """The step a record belongs to (0: a record logged before the first step, or without one)."""
    try:
        return int(record.get("step", 0))
    except (TypeError, ValueError):
        return 0


def truncate_after(path: Path, step: int) -> None:
    """Keep only records with ``step <= step`` (atomic rewrite)."""
    if not path.is_file():
        return
    kept = [line for line, record in read_records(path) if record_step(record) <= step]
    write_atomic(path, "".join(line + "\n" for line in kept))


def _wandb_mode(cfg: Config) -> str:
    if os.environ.get("WANDB_MODE"):  # the user's environment wins (make test sets disabled)
        return os.environ["WANDB_MODE"]
    mode = cfg.logging.wandb_mode
    if mode == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return mode


def _numeric(record: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


def _loss(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else str(value)


def format_train_line(record: dict[str, Any], total_steps: int, eta_s: float | None = None) -> str:
    """The console line of one ``train`` record (Megatron-LM / torchtitan content; fields the
    record lacks are left out); ``eta_s``: the estimated time to the last step, appended as ``ETA``."""
    r = record
    parts = [f"step {r['step']:>{len(str(total_steps))}}/{total_steps}", f"loss {_loss(r['loss'])}"]
    lr_muon, lr_adamw = r.get("lr_muon"), r.get("lr_adamw")
    if lr_muon is not None and lr_adamw is not None and lr_muon != lr_adamw:
        parts.append(f"lr {lr_muon:.2e} (Muon) {lr_adamw:.2e} (AdamW)")
    elif lr_muon is not None or lr_adamw is not None:
        parts.append(f"lr {lr_muon if lr_muon is not None else lr_adamw:.2e}")
    if "grad_norm" in r:
        parts.append(f"grad norm {r['grad_norm']:.3f}")
    if "tokens_per_s" in r:
        parts.append(f"{r['tokens_per_s']:,.0f} tok/s")
    if r.get("mfu") is not None:  # null on CPU without logging.peak_tflops
        parts.append(f"MFU {100 * r['mfu']:.2f}%")
    if "mem_gib" in r:
        parts.append(f"mem {r['mem_gib']:.2f} GiB (peak {r.get('mem_peak_gib', r['mem_gib']):.2f})")
    if "step_time_s" in r:
        parts.append(f"{r['step_time_s']:.3f} s/step")
    if r.get("skipped_updates"):
        parts.append(f"skipped updates {r['skipped_updates']}")
    if eta_s is not None and math.isfinite(eta_s):
        parts.append(f"ETA {timedelta(seconds=round(eta_s))}")
    return " | ".join(parts)


def format_eval_line(record: dict[str, Any]) -> str:
    """``validation at step N | loss r=1 4.1234 | r=3 3.4567``: held-out loss per loop count r."""
    losses = [(int(k[len("val_loss_r"):]), v) for k, v in record.items() if k.startswith("val_loss_r")]
    cells = [f"r={r} {_loss(v)}" for r, v in sorted(losses)]
    return f"validation at step {record['step']} | loss " + " | ".join(cells)


def format_dynamics_line(record: dict[str, Any]) -> str:
    """``loop dynamics at step N | loss r=2 4.1 | r=3 3.9 | r=4 4.0 | update 0.52 0.11 0.03 0.02``:
    the batch loss one loop below, at and above K, and the relative update of each loop
    (training/dynamics.py)."""
    losses = sorted((int(k[len("batch_loss_r"):]), v) for k, v in record.items() if k.startswith("batch_loss_r"))
    updates = sorted((int(k[len("relative_update_l"):]), v) for k, v in record.items()
                     if k.startswith("relative_update_l"))
    return (f"loop dynamics at step {record['step']} | loss " + " | ".join(f"r={r} {_loss(v)}" for r, v in losses)
            + " | update " + " ".join(f"{v:.3g}" for _, v in updates))


class MetricsLogger:
    """Rank-0 sink for metrics; every method is a no-op on other ranks."""

    def __init__(self, cfg: Config, *, enabled: bool, start_step: int, total_steps: int) -> None:
        self.enabled = enabled
        self.cfg = cfg
        self.path = Path(cfg.train.output_dir) / METRICS_NAME
        self.start_step = start_step
        self.total_steps = total_steps
        self.last: dict[str, dict[str, Any]] = {}  # newest record per event (for the summary)
        self.train_usage: list[dict[str, Any]] = []
        self._file = None
        self.recreated_at: int | None = None  # step at which a removed metrics.jsonl was recreated
        self._wandb = None
        self._tensorboard = None
        self._bar = None
        self._started = time.monotonic()  # the ETA extrapolates this run's mean step time
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        truncate_after(self.path, start_step)
        self._file = self.path.open("a", encoding="utf-8")
        if cfg.logging.wandb_project and _wandb_mode(cfg) != "disabled":
            self._wandb = self._init_wandb(cfg)
        if cfg.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: a resumed run drops the events past its checkpoint, as truncate_after does
            self._tensorboard = SummaryWriter(log_dir=str(self.path.parent / TENSORBOARD_DIR),
                                              purge_step=start_step + 1 if start_step else None)
        if show_progress(cfg.logging.progress_bar):  # a bar in a log file is \r-separated junk
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step",
                             file=sys.stderr, dynamic_ncols=True)

    @staticmethod
    def _init_wandb(cfg: Config):
        import wandb

        out = Path(cfg.train.output_dir)
        id_file = out / WANDB_ID_NAME
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        write_atomic(id_file, run_id)  # a resumed run continues the same wandb run
        from megatron_loop.config.naming import run_name

        # named after train.output_dir unless the user named the run (config/naming.py)
        return wandb.init(project=cfg.logging.wandb_project, name=run_name(cfg),
                          id=run_id, resume="allow", dir=str(out), mode=_wandb_mode(cfg),
                          config=cfg.to_dict())

    def _reopen_if_removed(self, step: int | None) -> None:
        """``metrics.jsonl`` deleted or replaced under the run (the folder itself is watched by the
        run lock): appending to the unlinked file would lose every record silently, so recreate
        it, say so, and note the step in the file and in the summary."""
        try:
            same = os.path.samestat(os.fstat(self._file.fileno()), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if same or not self.path.parent.is_dir():  # the folder itself vanished: the run stops on that
            return
        self._file.close()
        self._file = self.path.open("a", encoding="utf-8")
        self.recreated_at = step
        self.message(f"warning: {self.path} was removed during the run; recreated at step {step} "
                     "(the records before it are lost)")
        self._file.write(json.dumps({"event": "metrics_recreated", "step": step}) + "\n")

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        event = record.get("event")
        self.last[event] = record
        try:
            self._reopen_if_removed(record.get("step"))
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        except OSError as e:  # name the file (a failed flush carries no file name)
            raise OSError(e.errno, e.strerror, str(self.path)) from None
        numeric = _numeric(record)
        if self._wandb is not None and numeric and event != "start":  # start: the schedule, no series
            self._wandb.log(numeric, step=record.get("step"))
        if self._tensorboard is not None and numeric and event in ("train", "eval", "dynamics"):
            for key, value in numeric.items():
                self._tensorboard.add_scalar(f"{event}/{key}", value, global_step=record.get("step"))
            self._tensorboard.flush()
        if event == "train":
            if self._bar is not None:
                self._bar.n = record["step"]
                self._bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}",
                                      refresh=False)
                self._bar.refresh()
            self.message(format_train_line(record, self.total_steps, self.eta_s(record["step"])))
        elif event == "eval" and len(numeric) > 0:
            self.message(format_eval_line(record))
        elif event == "dynamics":
            self.message(format_dynamics_line(record))

    def eta_s(self, step: int) -> float | None:
        """Seconds to ``total_steps`` at the mean time per step of this run so far (validation and
        saves included, so it tracks the wall clock)."""
        done = step - self.start_step
        return (time.monotonic() - self._started) / done * (self.total_steps - step) if done > 0 else None

    def data_usage(self, train_usage: list[dict[str, Any]], valid_prefixes: list[str], valid_batches: int) -> None:
        """Log how often the run reads each train prefix (data reuse) and what validation uses."""
        if not self.enabled:
            return
        self.train_usage = train_usage
        seq = self.cfg.train.seq_length
        left = max(self.total_steps - self.start_step, 0)
        for u in train_usage:
            reuse = " (repeated data)" if u["epochs"] > 1 else ""
            whole = f"{u['samples']:,} sequences = {u['epochs']:.2f} epochs{reuse}"
            if self.start_step:  # a resumed run reads the rest (a blend: each prefix in its share)
                more = round(u["samples"] * left / self.total_steps) if self.total_steps else 0
                reads = (f"this run reads {more:,} more sequences (steps {self.start_step + 1}-{self.total_steps}); "
                         f"the whole run reads {whole}")
            else:
                reads = f"this run reads {whole}"
            self.message(f"data: {u['prefix']}: {u['tokens']:,} tokens = {u['tokens'] // seq:,} sequences of {seq} "
                         f"per epoch; {reads}")
        if valid_batches:
            self.message(f"validation: {', '.join(valid_prefixes)}: {valid_batches} micro-batches at "
                         f"r = {', '.join(map(str, self.cfg.train.eval_loops))} every "
                         f"{self.cfg.train.eval_interval} steps")
        else:
            why = ("train.eval_interval=0" if not self.cfg.train.eval_interval else
                   "data.valid_prefixes: []" if self.cfg.data.valid_prefixes == [] else
                   "no data.valid_prefixes and no _valid prefix next to the first train prefix")
            self.message(f"validation: off ({why})")
        self.log({"event": "data", "step": self.start_step, "train": train_usage, "valid": valid_prefixes,
                  "valid_batches": valid_batches})

    def summary(self, step: int, consumed_samples: int, wall_s: float, reason: str | None = None) -> None:
        """The end-of-run block: steps, wall time, tokens, data epochs, final losses, checkpoint."""
        if not self.enabled:
            return
        t = self.cfg.train
        tokens_run = (step - self.start_step) * t.global_batch_size * t.seq_length
        train, ev, ckpt = self.last.get("train", {}), self.last.get("eval", {}), self.last.get("checkpoint", {})
        planned = self.total_steps * t.global_batch_size
        epochs = [(u["prefix"], u["epochs"] * consumed_samples / planned) for u in self.train_usage if planned]
        record = {"event": "summary", "step": step, "total_steps": self.total_steps, "wall_time_s": wall_s,
                  "tokens": consumed_samples * t.seq_length, "tokens_this_run": tokens_run,
                  "final_loss": train.get("loss"), "checkpoint": ckpt.get("path"), "stopped": reason,
                  "metrics_recreated_at": self.recreated_at,
                  "epochs": dict(epochs), **{k: v for k, v in ev.items() if k.startswith("val_loss_r")}}
        self.log(record)
        how = f"stopped ({reason})" if reason else "finished"
        lines = [f"training {how} at step {step}/{self.total_steps} after {timedelta(seconds=round(wall_s))} "
                 f"(wall time of this run)",
                 f"  tokens: {consumed_samples * t.seq_length:,} in total, {tokens_run:,} in this run"
                 + "".join(f"; {e:.2f} epochs of {p}" for p, e in epochs)]
        losses = []
        if train:
            losses.append(f"final train loss {_loss(train['loss'])} (step {train['step']})")
        if ev:
            losses.append(format_eval_line(ev))
        if losses:
            lines.append("  " + " | ".join(losses))
        lines.append(f"  checkpoint: {os.path.abspath(ckpt['path']) if 'path' in ckpt else 'none'}")
        lines.append(f"  metrics: {self.path} (plot: python tools/plot_metrics.py {self.path.parent})")
        if self.recreated_at is not None:
            lines.append(f"  metrics: recreated at step {self.recreated_at} after it was removed; earlier records lost")
        if self._bar is not None:  # closed first: its final redraw would otherwise follow the summary
            self._bar.close()
            self._bar = None
        self.message("\n".join(lines))

    def message(self, text: str) -> None:
        """A human-readable line on rank 0 (through tqdm so the bar is not torn)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._file is not None:
            self._file.close()
        self._bar = self._wandb = self._tensorboard = self._file = None
