"""What one trained model is: a layout ``p+s×K+c`` of a backbone family plus its conditioning.

:class:`Conditioning` is the paper's three mechanisms (Sec. 5): initial-state injection,
history-state injection over a window w, and timestep conditioning. :class:`Run` is one model
the paper trains, named as its file: ``qwen_4x7_init_channel+hist_channel_w2+lg``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from megatron_loop.config import BACKBONES
from megatron_loop.config.naming import conditioning_notation
from megatron_loop.registry.recipes import FAMILIES, Family

Layout = tuple[int, int, int, int]  # (p, s, K, c) of p+s×K+c

TIMESTEP_SHORT = {"loop_gating": "lg", "branch_gating": "bg", "adaln": "adaln", "shortcut": "shortcut"}


@dataclass(frozen=True)
class Conditioning:
    """Initial-state injection, history-state injection (window w), timestep conditioning."""

    initial: str = "none"
    history: str = "none"
    window: int = 1
    timestep: str = "none"
    init_noise: float = 0.0  # model.injection_init_noise (App. E.1)

    @property
    def suffix(self) -> str:
        """File-name suffix: ``init_channel+hist_channel_w2+lg`` ('' without conditioning)."""
        parts = []
        if self.initial != "none":
            parts.append(f"init_{self.initial}")
        if self.history != "none":
            parts.append(f"hist_{self.history}_w{self.window}")
        if self.timestep != "none":
            parts.append(TIMESTEP_SHORT[self.timestep])
        if self.init_noise:
            parts.append("noise")
        return "+".join(parts)

    @property
    def label(self) -> str:
        """The paper's legend notation: ``I(channel)+H(channel, w=2)+LG``; ``none`` without
        (:func:`megatron_loop.config.naming.conditioning_notation`, which training records too)."""
        return conditioning_notation(self.initial, self.history, self.window, self.timestep, self.init_noise)

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The mechanisms in use, of ``initial``, ``history``, ``timestep`` (Sec. 5.1, 5.2)."""
        return tuple(name for name in ("initial", "history", "timestep") if getattr(self, name) != "none")

    def model_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.initial != "none":
            out["initial_injection"] = self.initial
        if self.init_noise:
            out["injection_init_noise"] = self.init_noise
        if self.history != "none":
            out["history_injection"] = self.history
            out["history_window"] = self.window
        if self.timestep != "none":
            out["timestep"] = self.timestep
        return out

    def paper_parameters(self, d: int, core_layers: int) -> int:
        """Extra parameters by App. C.1: initial 1 | 2d | 2d | 2d^2; history w | wd | wd^2;
        timestep 8 (LG) | 16s (BG) | 32sd (AdaLN) for s shared layers; LoopFormer's shortcut modulation (its
        code, models/loopformer.py): (4d^2 + 4d) s and the two (t, dt) embedders 2 (256d + d + d^2 + d)."""
        initial = {"none": 0, "scalar": 1, "channel": 2 * d, "residual_channel": 2 * d, "dense": 2 * d * d}
        history = {"none": 0, "scalar": self.window, "channel": self.window * d, "dense": self.window * d * d}
        timestep = {"none": 0, "loop_gating": 8, "branch_gating": 16 * core_layers,
                    "adaln": 32 * core_layers * d,
                    "shortcut": (4 * d * d + 4 * d) * core_layers + 2 * (256 * d + d + d * d + d)}
        return initial[self.initial] + history[self.history] + timestep[self.timestep]


NO_CONDITIONING = Conditioning()


@dataclass(frozen=True)
class Run:
    """One model the paper trains."""

    name: str
    family: str
    prelude: int
    core: int
    loops: int
    coda: int
    conditioning: Conditioning = NO_CONDITIONING
    paper_params: int | None = None  # the paper's (unconditioned) parameter count of this layout
    paper_params_precision: int = 1  # 1: exact; 10_000: reported as "187.05M"
    paper_params_source: str = ""
    train: tuple[tuple[str, Any], ...] = ()  # extra train.* keys (the optimizer ablation, a peer design's objective)
    note: str = ""
    # extra model.* keys beyond the paper's conditioning: a peer design of the optimizer pilot (App. D.1,
    # Table 7: Huginn, Ouro, LoopFormer as their own papers define them, registry/pilot.py)
    model: tuple[tuple[str, Any], ...] = ()

    @property
    def layout(self) -> str:
        """``4x7`` (BaseLoop), ``20x1`` (NonLoop), ``2+2x9+0`` (CoreLoop), as the file names."""
        if self.prelude or self.coda:
            return f"{self.prelude}+{self.core}x{self.loops}+{self.coda}"
        return f"{self.core}x{self.loops}"

    @property
    def kind(self) -> str:
        if self.loops == 1:
            return "NonLoop"
        return "CoreLoop" if self.prelude or self.coda else "BaseLoop"

    @property
    def physical_depth(self) -> int:
        return self.prelude + self.core + self.coda

    @property
    def effective_depth(self) -> int:
        return self.prelude + self.loops * self.core + self.coda

    @property
    def recipe(self) -> Family:
        """The family's recipe (:data:`~megatron_loop.registry.recipes.FAMILIES`)."""
        return FAMILIES[self.family]

    @property
    def layout_tuple(self) -> Layout:
        return (self.prelude, self.core, self.loops, self.coda)

    def model_fields(self, backbone: str | None = None) -> dict[str, Any]:
        return dict(backbone=backbone or self.recipe.backbone, prelude_layers=self.prelude, core_layers=self.core,
                    train_loops=self.loops, coda_layers=self.coda, **self.conditioning.model_fields(),
                    **dict(self.model))

    def paper_conditioning_parameters(self) -> int:
        return self.conditioning.paper_parameters(BACKBONES[self.recipe.backbone]["hidden_size"], self.core)

    def describe(self) -> str:
        cond = "" if self.conditioning == NO_CONDITIONING else f" + {self.conditioning.label}"
        extra = "".join(f", {k}={v}" for k, v in self.train if k == "optimizer")
        return f"{self.recipe.label} {self.kind} {self.layout}{cond}{extra}"


# Table 2 (exact, per physical depth) and Table 1 (NonLoop references); App. C.1 rounds the
# other Qwen BaseLoops to 0.01M ("approximately 187.05M, 218.51M, 265.70M, and 375.82M").
# (family, physical depth) -> (parameters, precision, source)
PAPER_PARAMETER_COUNTS: dict[tuple[str, int], tuple[int, int, str]] = {
    ("llama", 2): (455_351_808, 1, "Table 2"),
    ("llama", 4): (516_699_648, 1, "Table 2"),
    ("llama", 5): (547_373_568, 1, "Table 2"),
    ("llama", 10): (700_743_168, 1, "Table 2"),
    ("llama", 20): (1_007_482_368, 1, "Table 1"),
    ("qwen", 2): (187_050_000, 10_000, "App. C.1"),
    ("qwen", 4): (218_507_264, 1, "Table 2"),
    ("qwen", 7): (265_700_000, 10_000, "App. C.1"),
    ("qwen", 14): (375_820_000, 10_000, "App. C.1"),
    ("qwen", 28): (596_049_920, 1, "Table 1"),
}


def make_run(family: str, layout: Layout, conditioning: Conditioning = NO_CONDITIONING,
             name: str | None = None, **fields: Any) -> Run:
    """A run named after its family, layout and conditioning, with the paper's parameter count of
    its physical depth (none for a run with its own ``train`` recipe: the optimizer pilot)."""
    p, s, k, c = layout
    paper = PAPER_PARAMETER_COUNTS.get((family, p + s + c)) if "train" not in fields else None
    run = Run("", family, p, s, k, c, conditioning, *(paper or (None, 1, "")), **fields)
    suffix = conditioning.suffix
    return replace(run, name=name or f"{family}_{run.layout}" + (f"_{suffix}" if suffix else ""))


def baseloop_layout(family: str, core_layers: int) -> Layout:
    """The BaseLoop ``s×K`` of the family's effective depth: K = L(K) / s (App. C.1)."""
    return (0, core_layers, FAMILIES[family].effective_depth // core_layers, 0)
