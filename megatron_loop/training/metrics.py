"""Per-step metrics: JSONL always, wandb when configured, a tqdm bar on rank 0 (issue 5 item 6).

Only rank 0 writes. ``{output_dir}/metrics.jsonl`` holds one JSON object per line with an
``event`` key: ``train`` (step, loss, lr_muon, lr_adamw, grad_norm, tokens_per_s, mfu, memory,
...), ``eval`` (``val_loss_r{r}`` per loop count), and lifecycle events (``resume``,
``checkpoint``, ``nonfinite``, ``stop``). On resume, records past the resumed step are dropped
first (a crashed run may have logged steps that the resumed run replays), so the file is
always the trajectory of the weights on disk.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import sys
from pathlib import Path
from typing import Any

import torch

from megatron_loop.config import Config

METRICS_NAME = "metrics.jsonl"
WANDB_ID_NAME = "wandb_run_id"


def memory_stats() -> dict[str, float]:
    """Accelerator memory (allocated now / peak) on GPU; resident set size on CPU, in GiB."""
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


def truncate_after(path: Path, step: int) -> None:
    """Keep only records with ``step <= step`` (atomic rewrite)."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a crash mid-write
        if record.get("step", 0) <= step:
            kept.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def _wandb_mode(cfg: Config) -> str:
    if os.environ.get("WANDB_MODE"):  # the user's environment wins (make test sets disabled)
        return os.environ["WANDB_MODE"]
    mode = cfg.logging.wandb_mode
    if mode == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return mode


class MetricsLogger:
    """Rank-0 sink for metrics; every method is a no-op on other ranks."""

    def __init__(self, cfg: Config, *, enabled: bool, start_step: int, total_steps: int) -> None:
        self.enabled = enabled
        self.path = Path(cfg.train.output_dir) / METRICS_NAME
        self._file = None
        self._wandb = None
        self._bar = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        truncate_after(self.path, start_step)
        self._file = self.path.open("a", encoding="utf-8")
        if cfg.logging.wandb_project and _wandb_mode(cfg) != "disabled":
            self._wandb = self._init_wandb(cfg)
        if cfg.logging.progress_bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step",
                             file=sys.stderr, dynamic_ncols=True)

    @staticmethod
    def _init_wandb(cfg: Config):
        import wandb

        out = Path(cfg.train.output_dir)
        id_file = out / WANDB_ID_NAME
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        id_file.write_text(run_id)  # a resumed run continues the same wandb run
        return wandb.init(project=cfg.logging.wandb_project, name=cfg.logging.wandb_run_name,
                          id=run_id, resume="allow", dir=str(out), mode=_wandb_mode(cfg),
                          config=cfg.to_dict())

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            numeric = {k: v for k, v in record.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
            if numeric:
                self._wandb.log(numeric, step=record.get("step"))
        if self._bar is not None and record.get("event") == "train":
            self._bar.n = record["step"]
            self._bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}",
                                  refresh=False)
            self._bar.refresh()

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
        if self._file is not None:
            self._file.close()
        self._bar = self._wandb = self._file = None
