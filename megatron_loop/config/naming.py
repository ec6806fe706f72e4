"""What a run is called, from its config alone (no matplotlib, no registry): the run folder's name,
the conditioning in the paper's legend notation and the label that names a run on figures and in
logs -- ``NAME (p+sxK+c, conditioning)``.

Training records the label at start (the ``start`` event of metrics.jsonl), so
``tools/plot_metrics.py`` names each run by what it is, and the registry's run table and the eval
figures write the conditioning the same way (:func:`conditioning_notation`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from megatron_loop.config.sections import Config, ModelConfig

# tools/pipeline.sh lays a run out as runs/NAME/{train/checkpoints,hf}: these folders are not its name
PIPELINE_FOLDERS = ("train", "checkpoints", "hf")
TIMESTEP_LABEL = {"loop_gating": "LG", "branch_gating": "BG", "adaln": "AdaLN",
                  "shortcut": "Shortcut"}  # LoopFormer's shortcut modulation on (t, dt)


def named_folder(path: str | Path) -> Path:
    """runs/NAME of runs/NAME/train[/checkpoints[/global_stepN]] or runs/NAME/hf: the first folder up
    the path that is not one of the pipeline's fixed folder names."""
    folder = Path(path).resolve()
    while folder.parent != folder and (folder.name in PIPELINE_FOLDERS or folder.name.startswith("global_step")):
        folder = folder.parent
    return folder


def run_folder_name(path: str | Path) -> str:
    """NAME of runs/NAME/train[/checkpoints[/global_stepN]] or runs/NAME/hf (:func:`named_folder`)."""
    return named_folder(path).name


def conditioning_notation(initial: str = "none", history: str = "none", window: int = 1, timestep: str = "none",
                          init_noise: float = 0.0) -> str:
    """The paper's legend notation (Sec. 5): ``I(channel)+H(channel, w=2)+LG``; ``none`` without."""
    parts = []
    if initial != "none":
        parts.append(f"I({initial}" + (f", noise {init_noise:g}" if init_noise else "") + ")")
    if history != "none":
        parts.append(f"H({history}, w={window})")
    if timestep != "none":
        parts.append(TIMESTEP_LABEL[timestep])
    return "+".join(parts) or "none"


def model_conditioning(model: ModelConfig) -> str:
    """:func:`conditioning_notation` of a model config."""
    return conditioning_notation(model.initial_injection, model.history_injection, model.history_window,
                                 model.timestep, model.injection_init_noise)


def run_name(cfg: Config) -> str:
    """The run's name: ``logging.wandb_run_name``, unless it is only the name of the YAML it came from
    (every shipped config names its run after its file and its ``runs/NAME`` folder), in which case the
    folder the run writes to: a config trained into another ``train.output_dir`` is named after it."""
    given = cfg.logging.wandb_run_name
    if given and given != Path(cfg.source).stem:
        return given
    return run_folder_name(cfg.train.output_dir)


def run_label(cfg: Config) -> str:
    """``NAME (p+sxK+c, conditioning)``: what a run is, for legends (conditioning left out when none)."""
    facts = [cfg.model.layout, model_conditioning(cfg.model)]
    return f"{run_name(cfg)} ({', '.join(f for f in facts if f != 'none')})"
