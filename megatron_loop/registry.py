"""Registry of the paper's runs and studies: every model the paper trains, by name.

One entry (:class:`Run`) per trained model: backbone family, layout ``p+s×K+c``, conditioning,
the parameter count the paper reports for its layout (where it reports one) and any note on
how an ambiguous passage was read. One :class:`Study` per figure or table: the runs behind it,
how far its loop sweep goes, whether it needs the geometry probes, and its toy-scale CPU twin.
A run's paper references are the studies that contain it (one source of truth).

Citations follow the paper's LaTeX source (``../shared/seed/``): appendices C.1-C.4
(settings), D.1-D.6 (full results), E.1-E.2 (further analysis); Tables 1-12; Figs. 1-23.

What is generated from here (never written by hand):
  * ``examples/NAME.yaml`` for every run: ``python tools/generate_configs.py`` (``--check`` in
    the tests); the recipe comes from :data:`FAMILIES` (App. C.2, Table 3) and the execution
    settings from :data:`EXECUTION`, the one place to change micro-batch, checkpointing,
    compilation or the DeepSpeed config of every generated file.
  * ``python pretrain_loop.py --list-configs``: every run with layout, parameters and paper refs.
  * ``bash tools/small_study.sh STUDY``: the toy twin of a study, trained, exported and swept.
  * ``python tools/generate_configs.py --study STUDY --commands``: the paper-scale commands.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable

from megatron_loop.config import BACKBONES, build_model_config
from megatron_loop.plan import count_parameters

# --------------------------------------------------------------------------------------
# Families, recipes and execution settings
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """A backbone family with its recipe (App. C.1, C.2, Tables 1 and 3)."""

    key: str  # file-name prefix
    label: str  # the paper's name
    backbone: str  # config.BACKBONES preset
    toy_backbone: str  # the CPU-sized twin preset
    effective_depth: int  # L(K) of every BaseLoop / CoreLoop / NonLoop run of the family (App. C.1)
    lr: float
    global_batch_size: int
    train_tokens: int
    tokens_note: str
    tokenizer: str
    data_prefix: str  # tools/preprocess_data.py --output-prefix (README step 1)


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", "Llama3.1-1B", "llama3.1-1b", "tiny-llama", 20, 1.33847e-3, 1824, 20_149_647_360,
                    "20 tokens/parameter of the 20-layer NonLoop reference (1,007,482,368): 5,394 updates, "
                    "W/S/D 270/4,585/539", "meta-llama/Llama-3.1-8B", "data/fineweb_edu_llama"),
    "qwen": Family("qwen", "Qwen3-0.6B", "qwen3-0.6b", "tiny-qwen", 28, 1.80111e-3, 2048, 11_995_709_440,
                   "12.00B tokens = 2,860 updates x 2,048 x 2,048: W/S/D 143/2,431/286", "Qwen/Qwen3-0.6B",
                   "data/fineweb_edu_qwen"),
}
DATA_PARALLEL = 8  # ranks per run in the paper (App. C.2: 38 x 6 x 8 = 1,824; 32 x 8 x 8 = 2,048)

# Execution settings of every generated file: how a run executes, not what it computes. The ONE
# place to change them (per family, and ``toy`` for the CPU twins of tools/small_study.sh).
EXECUTION: dict[str, dict[str, Any]] = {
    # auto checkpointing (budget null: 90 % of the GPU less what the first step finds allocated)
    # and auto compilation (on with CUDA): the issue-13 settings, docs/BENCHMARKS.md.
    "llama": dict(micro_batch_size=38, activation_checkpointing="auto", compile="auto",
                  deepspeed_config="deepspeed_configs/zero1.json"),
    "qwen": dict(micro_batch_size=32, activation_checkpointing="auto", compile="auto",
                 deepspeed_config="deepspeed_configs/zero1.json"),
    "toy": dict(micro_batch_size=8, activation_checkpointing="none", compile="auto",
                deepspeed_config="deepspeed_configs/zero1.json"),
}
# The toy recipe of the CPU twins (examples/tiny_*.yaml): App. C.2's schedule shape at toy size.
TOY_TRAIN: dict[str, Any] = dict(seq_length=128, global_batch_size=16, lr=3.0e-3, max_steps=300, seed=42,
                                 precision="fp32", save_interval=100, eval_interval=100, eval_batches=4)


# --------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------

TIMESTEP_SHORT = {"loop_gating": "lg", "branch_gating": "bg", "adaln": "adaln"}
TIMESTEP_LABEL = {"loop_gating": "LG", "branch_gating": "BG", "adaln": "AdaLN"}
INJECTION_LABEL = {"scalar": "scalar", "channel": "channel-wise", "residual_channel": "residual channel-wise",
                   "dense": "dense"}


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
        """The paper's legend notation: ``I(channel)+H(channel, w=2)+LG``; ``none`` without."""
        parts = []
        if self.initial != "none":
            parts.append(f"I({self.initial}" + (f", noise {self.init_noise:g}" if self.init_noise else "") + ")")
        if self.history != "none":
            parts.append(f"H({self.history}, w={self.window})")
        if self.timestep != "none":
            parts.append(TIMESTEP_LABEL[self.timestep])
        return "+".join(parts) or "none"

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
        timestep 8 (LG) | 16s (BG) | 32sd (AdaLN) for s shared layers."""
        initial = {"none": 0, "scalar": 1, "channel": 2 * d, "residual_channel": 2 * d, "dense": 2 * d * d}
        history = {"none": 0, "scalar": self.window, "channel": self.window * d, "dense": self.window * d * d}
        timestep = {"none": 0, "loop_gating": 8, "branch_gating": 16 * core_layers,
                    "adaln": 32 * core_layers * d}
        return initial[self.initial] + history[self.history] + timestep[self.timestep]


NONE = Conditioning()


@dataclass(frozen=True)
class Run:
    """One model the paper trains."""

    name: str
    family: str
    prelude: int
    core: int
    loops: int
    coda: int
    conditioning: Conditioning = NONE
    paper_params: int | None = None  # the paper's (unconditioned) parameter count of this layout
    paper_params_precision: int = 1  # 1: exact; 10_000: reported as "187.05M"
    paper_params_source: str = ""
    train: tuple[tuple[str, Any], ...] = ()  # extra train.* keys (the optimizer ablation)
    note: str = ""

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
    def fam(self) -> Family:
        return FAMILIES[self.family]

    @property
    def layout_tuple(self) -> tuple[int, int, int, int]:
        return (self.prelude, self.core, self.loops, self.coda)

    def model_fields(self, backbone: str | None = None) -> dict[str, Any]:
        return dict(backbone=backbone or self.fam.backbone, prelude_layers=self.prelude, core_layers=self.core,
                    train_loops=self.loops, coda_layers=self.coda, **self.conditioning.model_fields())

    def paper_conditioning_parameters(self) -> int:
        return self.conditioning.paper_parameters(BACKBONES[self.fam.backbone]["hidden_size"], self.core)

    def describe(self) -> str:
        cond = "" if self.conditioning == NONE else f" + {self.conditioning.label}"
        extra = "".join(f", {k}={v}" for k, v in self.train if k == "optimizer")
        return f"{self.fam.label} {self.kind} {self.layout}{cond}{extra}"


# Table 2 (exact, per physical depth) and Table 1 (NonLoop references); App. C.1 rounds the
# other Qwen BaseLoops to 0.01M ("approximately 187.05M, 218.51M, 265.70M, and 375.82M").
_PAPER_PARAMS: dict[tuple[str, int], tuple[int, int, str]] = {
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


def make_run(family: str, layout: tuple[int, int, int, int], conditioning: Conditioning = NONE,
             name: str | None = None, **kw: Any) -> Run:
    p, s, k, c = layout
    paper = _PAPER_PARAMS.get((family, p + s + c)) if "train" not in kw else None
    run = Run("", family, p, s, k, c, conditioning, *(paper or (None, 1, "")), **kw)
    suffix = conditioning.suffix
    return replace(run, name=name or f"{family}_{run.layout}" + (f"_{suffix}" if suffix else ""))


def _bl(family: str, s: int) -> tuple[int, int, int, int]:
    return (0, s, FAMILIES[family].effective_depth // s, 0)


# ---- layouts (Sec. 3-4, App. C.1 "BaseLoop and CoreLoop models", Table 2)
BASELOOP_CORES = {"llama": (2, 4, 5, 10), "qwen": (2, 4, 7, 14)}
CORELOOPS = {
    "llama": [(0, 1, 19, 1), (1, 1, 19, 0),
              (0, 2, 9, 2), (1, 2, 9, 1), (2, 2, 9, 0),
              (0, 3, 6, 2), (1, 3, 6, 1), (2, 3, 6, 0),
              *[(p, 5, 3, 5 - p) for p in range(6)]],
    "qwen": [(0, 2, 13, 2), (1, 2, 13, 1), (2, 2, 13, 0)],
}
INITIAL = ("scalar", "channel", "residual_channel", "dense")
TIMESTEP = ("loop_gating", "branch_gating", "adaln")
WINDOWS = (1, 2, 4)


def _runs() -> list[Run]:
    runs: list[Run] = []
    for fam, cores in BASELOOP_CORES.items():
        L = FAMILIES[fam].effective_depth
        runs.append(make_run(fam, (0, L, 1, 0)))  # NonLoop reference (Table 1)
        runs += [make_run(fam, _bl(fam, s)) for s in cores]
        runs += [make_run(fam, layout) for layout in CORELOOPS[fam]]
        # initial-state injection x 4 for every BaseLoop (App. C.1, Figs. 4, 13, Tables 8-9)
        runs += [make_run(fam, _bl(fam, s), Conditioning(initial=i)) for s in cores for i in INITIAL]
        # timestep conditioning for every BaseLoop (Qwen: Fig. 6, Table 12; Llama: Table 11 = 4x5)
        runs += [make_run(fam, _bl(fam, s), Conditioning(timestep=t)) for s in cores for t in TIMESTEP]
    q47 = _bl("qwen", 4)
    # history-state injection, Qwen 4x7 (Fig. 5, Table 10)
    runs += [make_run("qwen", q47, Conditioning(history=h, window=w))
             for h in ("scalar", "channel", "dense") for w in WINDOWS]
    # initial + history, same parameterisation (Figs. 14-16)
    runs += [make_run("qwen", q47, Conditioning(initial=h, history=h, window=w))
             for h in ("scalar", "channel", "dense") for w in WINDOWS]
    fig17 = ("Fig. 17's caption says dense initial-state injection; the scores App. D.6 quotes for "
             "I+LG / I+BG (36.33 / 35.68 at D = 84 = channel-wise I alone, 36.20, +0.13 / -0.52) are "
             "channel-wise ones: both are registered")
    # initial + timestep: channel-wise (Fig. 7, numbers of App. D.6) and dense (Fig. 17's caption)
    runs += [make_run("qwen", q47, Conditioning(initial=i, timestep=t), note=fig17 if i == "dense" else "")
             for i in ("channel", "dense") for t in ("loop_gating", "branch_gating")]
    # history + timestep: channel-wise w = 1, 2, 4 (Figs. 7, 19, 20), dense w = 1, 2 (Fig. 18)
    runs += [make_run("qwen", q47, Conditioning(history="channel", window=w, timestep=t))
             for t in ("loop_gating", "branch_gating") for w in WINDOWS]
    runs += [make_run("qwen", q47, Conditioning(history="dense", window=w, timestep=t))
             for t in ("loop_gating", "branch_gating") for w in (1, 2)]
    # all three, channel-wise, w = 1, 2 (Figs. 7, 21)
    runs += [make_run("qwen", q47, Conditioning(initial="channel", history="channel", window=w, timestep=t))
             for t in ("loop_gating", "branch_gating") for w in (1, 2)]
    # initialisation-noise ablation (App. E.1, Fig. 22)
    runs += [make_run("qwen", q47, Conditioning(initial=i, init_noise=0.03))
             for i in ("scalar", "channel", "residual_channel")]
    runs += _pilot_runs()
    return runs


PILOT_NOTE = ("App. D.1 names neither backbone nor budget for the pilot: Qwen3-0.6B widths and recipe with "
              "the Chinchilla budget of the L(K)-layer NonLoop are assumed")
# The pilot's recipe values that App. D.1 does not give ("the same pre-training setup" only): what
# the generated files assume, marked in their comments and in --list-configs.
PILOT_ASSUMPTIONS: dict[tuple[str, str], str] = {
    ("model", "backbone"): "assumed (App. D.1 names no backbone): Qwen3-0.6B widths",
    ("train", "global_batch_size"): "assumed: the Qwen recipe's batch (App. C.2)",
    ("train", "lr"): "assumed: the Qwen peak lr (Table 3) for AdamW and Muon alike",
    ("train", "seq_length"): "assumed: the main runs' 2,048",
    ("train", "optimizer"): "the pilot's variable (App. D.1, Table 7)",
}
PILOT_BUDGET = ("train_tokens unset = 20 tokens per parameter of the run's L(K)-layer NonLoop "
                "(train.tokens_per_parameter)")
OURO_NOTE = ("Ouro read as BaseLoop 3x4 without its learned exit gate: App. D.1 names 'Ouro (3x4)' and "
             "'the same pre-training setup' only, and says nothing of the gate; Ouro's exit gate, trained with an "
             "entropy-regularised objective (Zhu et al. 2025), is not implemented in this stack, so this config "
             "trains the same model as pilot_baseloop_3x4 under its own name")


def _pilot_runs() -> list[Run]:
    """The optimizer pilot (App. D.1, Table 7), AdamW vs Muon. LoopFormer is read as BaseLoop +
    AdaLN (Sec. 5.2: AdaLN "adopts LoopFormer's modulation structure"), Huginn as CoreLoop +
    dense initial injection (Sec. 5.1: "Huginn implements I_phi by concatenating h and h0
    followed by a linear projection"), Ouro as BaseLoop 3x4 without its exit gate (OURO_NOTE)."""
    archs = [("nonloop_12x1", (0, 12, 1, 0), NONE, ""), ("nonloop_3x1", (0, 3, 1, 0), NONE, ""),
             ("baseloop_3x4", (0, 3, 4, 0), NONE, ""),
             ("loopformer_3x4", (0, 3, 4, 0), Conditioning(timestep="adaln"), "LoopFormer read as BaseLoop + AdaLN"),
             ("ouro_3x4", (0, 3, 4, 0), NONE, OURO_NOTE),
             ("huginn_1+2x5+1", (1, 2, 5, 1), Conditioning(initial="dense"),
              "Huginn read as CoreLoop + dense initial injection (without its sampled loop counts)")]
    runs = []
    for arch, layout, cond, note in archs:
        for opt, tag in (("adamw", "adamw"), ("muon_adamw", "muon")):
            runs.append(make_run("qwen", layout, cond, name=f"pilot_{arch}_{tag}",
                                 train=(("optimizer", opt), ("train_tokens", None)),
                                 note="; ".join(x for x in (PILOT_NOTE, note) if x)))
    return runs


def is_pilot(run: Run) -> bool:
    """A run of the optimizer pilot (App. D.1), whose recipe values are assumptions."""
    return run.name.startswith("pilot_")


RUNS: dict[str, Run] = {}
for _run in _runs():
    if _run.name in RUNS:
        raise AssertionError(f"duplicate registry name {_run.name}")
    RUNS[_run.name] = _run


# --------------------------------------------------------------------------------------
# Studies
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToyRun:
    """A CPU twin: tiny backbone, a (possibly scaled) layout, the same conditioning."""

    name: str
    family: str
    layout: tuple[int, int, int, int]
    conditioning: Conditioning = NONE
    twin_of: str = ""  # the registry run it stands for


@dataclass(frozen=True)
class Study:
    """The runs behind one paper figure or table."""

    name: str
    paper: str  # "Fig. 4, Table 9": the figures/tables it regenerates; "" when not in the paper
    title: str
    runs: tuple[str, ...]
    depth_multiple: int = 2  # loop sweep up to this multiple of L(K) (Sec. 6 goes to 3x)
    probes: bool = False  # needs tools/probe_geometry.py (App. C.4)
    params_only: bool = False  # a parameter-count table: --list-configs / --dry-run reproduce it
    toy_runs: tuple[ToyRun, ...] | None = None  # explicit twins; default: each run at tiny width
    note: str = ""
    # per-family exceptions to depth_multiple (Fig. 8: Llama at D = 40, Qwen up to 84)
    family_depth_multiple: tuple[tuple[str, int], ...] = ()
    # runs the study's figure shows but its table does not (Table 10 has no NonLoop row)
    figure_only: tuple[str, ...] = ()
    # CPU-twin settings of tools/small_study.sh (defaults: the bundled corpus and tasks, one seed)
    seeds: tuple[int, ...] = ()  # train.seed of each twin's copies (NAME-seedS); () = TOY_TRAIN's one
    toy_train: tuple[tuple[str, Any], ...] = ()  # train.* overrides of the twins (TOY_TRAIN otherwise)
    corpus_args: str = ""  # tools/make_corpus.py flags of the study's corpus
    eval_tasks: str = ""  # tools/eval_loops.py --tasks ('' = the bundled tasks, tools/pipeline.sh)

    def multiple_for(self, family: str) -> int:
        """How far the sweep of a run of ``family`` goes in this study (multiple of L(K))."""
        return dict(self.family_depth_multiple).get(family, self.depth_multiple)

    def toys(self) -> tuple[ToyRun, ...]:
        if self.toy_runs is not None:
            return self.toy_runs
        out = []
        for name in self.runs:
            r = RUNS[name]
            out.append(ToyRun(f"toy_{name}", r.family, (r.prelude, r.core, r.loops, r.coda), r.conditioning, name))
        return tuple(out)


def _names(runs: Iterable[Run]) -> tuple[str, ...]:
    return tuple(r.name for r in runs)


def _select(**want: Any) -> tuple[str, ...]:
    """Registry names whose attributes / conditioning fields match ``want`` (callables test)."""
    def ok(r: Run) -> bool:
        for key, value in want.items():
            have = getattr(r.conditioning, key) if hasattr(r.conditioning, key) else getattr(r, key)
            if not (value(have) if callable(value) else have == value):
                return False
        return True
    return _names(r for r in RUNS.values() if ok(r))


def _q47(*conds: Conditioning) -> tuple[str, ...]:
    return tuple(make_run("qwen", _bl("qwen", 4), c).name for c in conds)


def _phys(family: str, depth: int) -> tuple[str, ...]:
    return _select(family=family, physical_depth=depth, conditioning=NONE, train=(), loops=lambda k: k > 1)


C = Conditioning
_PAPER_STUDY = dict(train=())  # the pilot runs belong to Table 7 only
_LLAMA_BASE = _select(family="llama", kind="BaseLoop", conditioning=NONE)
_QWEN_BASE = _select(family="qwen", kind="BaseLoop", conditioning=NONE, **_PAPER_STUDY)
_QWEN_REF, _LLAMA_REF = ("qwen_28x1",), ("llama_20x1",)
_W2 = dict(history="channel", window=2)
_PAIRS = _q47(C(initial="channel", **_W2), C(initial="channel", timestep="loop_gating"),
              C(initial="channel", timestep="branch_gating"), C(timestep="loop_gating", **_W2),
              C(timestep="branch_gating", **_W2))
_TRIPLES = _q47(C(initial="channel", timestep="loop_gating", **_W2),
                C(initial="channel", timestep="branch_gating", **_W2))
_SINGLES = _q47(C(), C(initial="channel"), C(**_W2), C(timestep="loop_gating"), C(timestep="branch_gating"))


def _ih(kind: str) -> tuple[str, ...]:
    return _q47(C(), C(initial=kind), *(C(history=kind, window=w) for w in WINDOWS),
                *(C(initial=kind, history=kind, window=w) for w in WINDOWS))


def _ht(kind: str, gates: tuple[str, ...], windows: tuple[int, ...]) -> tuple[str, ...]:
    return _q47(C(), *(C(timestep=g) for g in gates), *(C(history=kind, window=w) for w in windows),
                *(C(history=kind, window=w, timestep=g) for g in gates for w in windows))


STUDY_LIST: list[Study] = [
    Study("table1", "Table 1", "Non-recurrent reference backbones", _LLAMA_REF + _QWEN_REF, params_only=True),
    Study("table2", "Table 2", "BaseLoop / CoreLoop allocations (one parameter count per physical depth)",
          _select(loops=lambda k: k > 1, conditioning=NONE, paper_params_source="Table 2"), params_only=True),
    Study("fig1", "Fig. 1", "Llama BaseLoop at L(K) = 20: knowledge vs reasoning, per-depth strata, allocations",
          _LLAMA_BASE + _LLAMA_REF),
    Study("fig2", "Fig. 2", "Llama BaseLoop vs CoreLoop at physical depths 2, 4, 5, 10",
          sum((_phys("llama", p) for p in (2, 4, 5, 10)), ())),
    Study("fig3", "Fig. 3", "Geometry of Llama BaseLoop / CoreLoop with 4 physical layers", _phys("llama", 4),
          probes=True),
    Study("fig4", "Fig. 4, Table 9", "Initial-state injection on Qwen BaseLoops",
          _QWEN_BASE + _select(family="qwen", kind="BaseLoop", initial=lambda i: i != "none", history="none",
                               timestep="none", init_noise=0.0, **_PAPER_STUDY) + _QWEN_REF),
    Study("fig5", "Fig. 5, Table 10", "History-state injection on Qwen 4x7, w = 1, 2, 4",
          _q47(C(), *(C(initial=k) for k in ("scalar", "channel", "dense")),
               *(C(history=k, window=w) for k in ("scalar", "channel", "dense") for w in WINDOWS)) + _QWEN_REF,
          depth_multiple=3, figure_only=_QWEN_REF),
    Study("fig6", "Fig. 6, Table 12", "Timestep conditioning (LG, BG, AdaLN) on Qwen BaseLoops",
          _QWEN_BASE + _select(family="qwen", kind="BaseLoop", timestep=lambda t: t != "none", initial="none",
                               history="none", **_PAPER_STUDY) + _QWEN_REF),
    Study("fig7", "Fig. 7", "Composed conditioning on Qwen 4x7 (channel-wise, w = 2): I, H, LG, BG, pairs, triples",
          _SINGLES + _PAIRS + _TRIPLES, depth_multiple=3),
    Study("fig8", "Fig. 8", "Computational interaction: Llama phys-4 at D = 40, Qwen 4x7 injection and pairs",
          _phys("llama", 4) + _q47(*(C(initial=i) for i in INITIAL)) + _PAIRS + _TRIPLES, depth_multiple=3,
          probes=True, family_depth_multiple=(("llama", 2),)),
    Study("fig9", "Fig. 9", "Qwen BaseLoop vs CoreLoop with 4 physical layers (App. D.2)", _phys("qwen", 4)),
    Study("fig10", "Fig. 10", "Geometry, Llama 2 physical layers (App. D.2)", _phys("llama", 2), probes=True),
    Study("fig11", "Fig. 11", "Geometry, Llama 5 physical layers (App. D.2)", _phys("llama", 5), probes=True),
    Study("fig12", "Fig. 12", "Geometry, Llama 10 physical layers (App. D.2)", _phys("llama", 10), probes=True),
    Study("fig13", "Fig. 13, Table 8", "Initial-state injection on Llama BaseLoops (App. D.3)",
          _LLAMA_BASE + _select(family="llama", kind="BaseLoop", initial=lambda i: i != "none") + _LLAMA_REF),
    Study("table7", "Table 7", "Optimizer pilot: AdamW vs Muon (App. D.1)",
          _select(name=lambda n: n.startswith("pilot_")), depth_multiple=1,
          note=PILOT_NOTE + "; Ouro 3x4 is BaseLoop 3x4 without its learned exit gate; Table 7 reports each model "
               "at its training depth"),
    Study("table11", "Table 11", "Timestep conditioning on Llama 4x5 (App. D.5)",
          ("llama_4x5", "llama_4x5_lg", "llama_4x5_bg", "llama_4x5_adaln") + _LLAMA_REF),
    Study("fig14", "Fig. 14", "Scalar initial + history injection, w = 1, 2, 4 (App. D.6)", _ih("scalar"),
          depth_multiple=3),
    Study("fig15", "Fig. 15", "Channel-wise initial + history injection, w = 1, 2, 4 (App. D.6)", _ih("channel"),
          depth_multiple=3),
    Study("fig16", "Fig. 16", "Dense initial + history injection, w = 1, 2, 4 (App. D.6)", _ih("dense"),
          depth_multiple=3),
    Study("fig17", "Fig. 17", "Initial-state injection + timestep (App. D.6)",
          _q47(C(), C(initial="dense"), C(initial="channel"), C(timestep="loop_gating"), C(timestep="branch_gating"),
               *(C(initial=i, timestep=t) for i in ("dense", "channel") for t in ("loop_gating", "branch_gating"))),
          depth_multiple=3, note=RUNS["qwen_4x7_init_dense+lg"].note),
    Study("fig18", "Fig. 18", "Dense history + timestep, w = 1, 2 (App. D.6)",
          _ht("dense", ("loop_gating", "branch_gating"), (1, 2)), depth_multiple=3),
    Study("fig19", "Fig. 19", "Channel-wise history + BG, w = 1, 2, 4 (App. D.6)",
          _ht("channel", ("branch_gating",), WINDOWS), depth_multiple=3),
    Study("fig20", "Fig. 20", "Channel-wise history + LG, w = 1, 2, 4 (App. D.6)",
          _ht("channel", ("loop_gating",), WINDOWS), depth_multiple=3),
    Study("fig21", "Fig. 21", "Initial + history + timestep, channel-wise, w = 1, 2 (App. D.6)",
          _q47(C(), C(initial="channel"), C(timestep="loop_gating"), C(timestep="branch_gating"),
               *(C(history="channel", window=w) for w in (1, 2)),
               *(C(initial="channel", history="channel", window=w) for w in (1, 2)),
               *(C(history="channel", window=w, timestep=t) for t in ("loop_gating", "branch_gating") for w in (1, 2)),
               *(C(initial="channel", history="channel", window=w, timestep=t)
                 for t in ("loop_gating", "branch_gating") for w in (1, 2))), depth_multiple=3),
    Study("fig22", "Fig. 22", "Initialisation noise of initial-state injection (App. E.1)",
          _q47(*(C(initial=i, init_noise=n) for i in ("scalar", "channel", "residual_channel") for n in (0.0, 0.03))),
          depth_multiple=3),
    Study("fig23", "Fig. 23", "Computational interaction of composed conditioning, per block pair (App. E.2)",
          _PAIRS + _TRIPLES + _q47(C(timestep="loop_gating", history="channel", window=2)), depth_multiple=3,
          probes=True),
    Study("ext_llama_timestep", "", "LG / BG / AdaLN on the other Llama BaseLoops (not in the paper)",
          _select(family="llama", timestep=lambda t: t != "none", core=lambda s: s != 4),
          note="issue 14 asks for timestep conditioning on every BaseLoop of both families; the paper "
               "reports Llama timestep conditioning for 4x5 only (Table 11)"),
    # The default of tools/small_study.sh: the Fig. 2 / Fig. 7 comparison scaled to a 2-core CPU:
    # physical depth 2 and L(K) = 6 for the LoopLMs (BaseLoop, CoreLoop, H+LG), NonLoop 6x1.
    Study("toy", "Figs. 2, 7 (scaled)", "BaseLoop vs CoreLoop vs H+LG at matched physical depth 2 and L(K) = 6",
          ("llama_20x1", "llama_2x10", "llama_0+1x19+1", "qwen_4x7_hist_channel_w2+lg"),
          toy_runs=(ToyRun("nonloop_6x1", "llama", (0, 6, 1, 0), NONE, "llama_20x1"),
                    ToyRun("baseloop_2x3", "llama", (0, 2, 3, 0), NONE, "llama_2x10"),
                    ToyRun("coreloop_0+1x5+1", "llama", (0, 1, 5, 1), NONE, "llama_0+1x19+1"),
                    ToyRun("baseloop_2x3_hist_lg", "llama", (0, 2, 3, 0),
                           C(history="channel", window=2, timestep="loop_gating"), "qwen_4x7_hist_channel_w2+lg")),
          note="scaled layouts on the tiny-llama backbone; r = 1..2K"),
    # The paper's first finding (Sec. 1, Fig. 1: extra loops help reasoning, not knowledge) at CPU
    # scale, with tasks a 2-core CPU can teach in minutes: recall of stored facts (Knowledge) and
    # CLUTRR-style kinship chains (Reasoning; the relation task the demo model learns, here with
    # depths 1-4 in training and unseen contexts of depths 1-4 asked: a depth the training
    # documents never reach has a kinship word they never contain), 3 seeds each: the looped model
    # against the NonLoop of equal unique parameters (2x1) and of equal effective depth (6x1).
    Study("finding1", "Fig. 1 (scaled)", "Knowledge vs reasoning: BaseLoop 2x3 against NonLoop 2x1 (same unique "
          "parameters) and NonLoop 6x1 (same effective depth), 3 seeds",
          ("llama_2x10", "llama_20x1"),
          toy_runs=(ToyRun("nonloop_2x1", "llama", (0, 2, 1, 0), NONE, ""),
                    ToyRun("baseloop_2x3", "llama", (0, 2, 3, 0), NONE, "llama_2x10"),
                    ToyRun("nonloop_6x1", "llama", (0, 6, 1, 0), NONE, "llama_20x1")),
          seeds=(1, 2, 3), toy_train=(("lr", 1.0e-2), ("max_steps", 800), ("micro_batch_size", 16)),
          corpus_args=("--prose-docs 0 --reasoning-tasks clutrr --reasoning-docs-per-task 20000 "
                       "--train-max-depth 4 --eval-max-depth 4 --eval-items-per-depth 75 "
                       "--knowledge-people 150 --knowledge-mentions 0 --knowledge-qa-fraction 1.0 "
                       "--knowledge-eval trained --knowledge-qa-mentions 50 --valid-docs 300"),
          eval_tasks="facts,clutrr=looplm_clutrr_local",
          note="tiny-llama backbone; facts: the 450 trained facts of 150 people; clutrr: kinship chains of "
               "1-4 relations in contexts not in training; r = 1..2K"),
]
STUDIES: dict[str, Study] = {s.name: s for s in STUDY_LIST}


def paper_refs(name: str) -> list[str]:
    """The paper figures, then tables, a run belongs to (from the studies that contain it)."""
    refs = {ref.strip() for s in STUDY_LIST if name in s.runs and s.paper and not s.toy_runs
            for ref in s.paper.split(",") if name not in s.figure_only or ref.strip().startswith("Fig.")}
    return sorted(refs, key=lambda ref: (not ref.startswith("Fig."), int(ref.split()[-1])))


# --------------------------------------------------------------------------------------
# Config files
# --------------------------------------------------------------------------------------

GENERATED_NOTE = ("Generated by tools/generate_configs.py from megatron_loop/registry.py: "
                  "edit the registry, not this file.")


def run_config(run: Run) -> dict[str, dict[str, Any]]:
    """The full YAML mapping of a paper-scale run (sections in file order)."""
    fam, ex = run.fam, EXECUTION[run.family]
    train: dict[str, Any] = dict(
        seq_length=2048, global_batch_size=fam.global_batch_size, micro_batch_size=ex["micro_batch_size"],
        lr=fam.lr, train_tokens=fam.train_tokens, warmup_fraction=0.05, stable_fraction=0.85,
        min_lr_ratio=0.1, weight_decay=0.1, grad_clip=1.0, seed=42, precision="auto",
        deepspeed_config=ex["deepspeed_config"], output_dir=f"runs/{run.name}", save_interval=250,
        eval_interval=250)
    train.update(dict(run.train))
    if train.get("train_tokens", 0) is None:
        train.pop("train_tokens")
    return dict(
        model=dict(run.model_fields(), activation_checkpointing=ex["activation_checkpointing"], compile=ex["compile"]),
        train=train,
        data=dict(train_prefixes=[fam.data_prefix], valid_prefixes=[fam.data_prefix + "_valid"],
                  tokenizer=fam.tokenizer, order="stream"),
        logging=dict(wandb_project="megatron_loop", wandb_run_name=run.name),
    )


def toy_config(toy: ToyRun, run_dir: str, train: dict[str, Any] | None = None,
               name: str | None = None) -> dict[str, dict[str, Any]]:
    """The full YAML mapping of a CPU twin trained on the bundled corpus prepared in ``run_dir``
    (``train``: overrides of TOY_TRAIN; ``name``: the run folder, default the twin's name)."""
    p, s, k, c = toy.layout
    ex = EXECUTION["toy"]
    name = name or toy.name
    return dict(
        model=dict(backbone=FAMILIES[toy.family].toy_backbone, prelude_layers=p, core_layers=s, train_loops=k,
                   coda_layers=c, **toy.conditioning.model_fields(),
                   activation_checkpointing=ex["activation_checkpointing"], compile=ex["compile"]),
        train={**TOY_TRAIN, "micro_batch_size": ex["micro_batch_size"], "deepspeed_config": ex["deepspeed_config"],
               **(train or {}), "output_dir": f"{run_dir}/{name}/train"},
        # the generated corpus is read for several epochs: a fresh permutation each (data.order)
        data=dict(train_prefixes=[f"{run_dir}/data/corpus"], valid_prefixes=[f"{run_dir}/data/corpus_valid"],
                  tokenizer=f"{run_dir}/tokenizer", order="shuffled"),
        logging=dict(wandb_run_name=name, progress_bar=False),
    )


def _scalar(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, float):
        if value != 0 and abs(value) < 1e-2:  # 1.33847e-3 rather than 0.00133847; YAML 1.1 needs the dot
            for digits in range(17):
                text = f"{value:.{digits}e}"
                if float(text) == value:
                    mantissa, exponent = text.split("e")
                    return f"{mantissa if '.' in mantissa else mantissa + '.0'}e{int(exponent)}"
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    return str(value)


def _comments(run: Run) -> dict[tuple[str, str], str]:
    fam, micro = run.fam, EXECUTION[run.family]["micro_batch_size"]
    accumulation = fam.global_batch_size // (micro * DATA_PARALLEL)
    out = {("train", "micro_batch_size"): f"x {accumulation} accumulation steps x {DATA_PARALLEL} data-parallel "
                                          "ranks (accumulation is derived)",
           ("train", "lr"): "one peak lr for Muon and AdamW",
           ("data", "order"): "App. C.1: the preprocessing stream (shuffle buffer 10,000, seed 42), not re-permuted"}
    if dict(run.train).get("train_tokens", 0) is not None:
        out[("train", "train_tokens")] = fam.tokens_note
    if is_pilot(run):
        out.update(PILOT_ASSUMPTIONS)
    return out


def dump_yaml(mapping: dict[str, dict[str, Any]], header: list[str],
              comments: dict[tuple[str, str], str] | None = None) -> str:
    """Sections and keys in the given order, with ``# header`` lines and inline comments."""
    comments = comments or {}
    lines = [f"# {h}" if h else "#" for h in header]
    for section, values in mapping.items():
        lines.append(f"{section}:")
        for key, value in values.items():
            note = comments.get((section, key))
            lines.append(f"  {key}: {_scalar(value)}" + (f"  # {note}" if note else ""))
    return "\n".join(lines) + "\n"


def _params_line(run: Run) -> str:
    if run.paper_params is None:
        return "Parameters: the paper gives none for this run (python pretrain_loop.py --config THIS --dry-run)."
    approx = "" if run.paper_params_precision == 1 else "about "
    text = f"Paper parameters: {approx}{run.paper_params:,} ({run.paper_params_source}, unconditioned)"
    extra = run.paper_conditioning_parameters()
    if extra:
        text += f" + {extra:,} conditioning (App. C.1)"
    return text + "."


def render_run(run: Run) -> str:
    """The text of ``examples/{run.name}.yaml``."""
    refs = ", ".join(paper_refs(run.name)) or "not in the paper"
    header = [f"{run.describe()} ({refs})",
              f"Layout p+s×K+c = {run.prelude}+{run.core}×{run.loops}+{run.coda}: physical depth "
              f"{run.physical_depth}, effective depth L(K) = {run.effective_depth}.",
              _params_line(run)]
    if run.note:
        header.append(f"Note: {run.note}.")
    if is_pilot(run):
        header.append(f"Budget (assumed): {PILOT_BUDGET}; the other assumed values are marked 'assumed' below.")
    header += ["Recipe: App. C.2 / Table 3. Check with: python pretrain_loop.py --config THIS --dry-run",
               GENERATED_NOTE]
    return dump_yaml(run_config(run), header, _comments(run))


def toy_copies(study: Study) -> list[tuple[ToyRun, str, int | None]]:
    """(twin, run name, seed) of every model tools/small_study.sh trains: each twin once, or once
    per seed of the study as ``NAME-seedS`` (seed by seed: an interrupted study has whole seeds)."""
    if not study.seeds:
        return [(toy, toy.name, None) for toy in study.toys()]
    return [(toy, f"{toy.name}-seed{seed}", seed) for seed in study.seeds for toy in study.toys()]


def render_toy(toy: ToyRun, run_dir: str, study: Study, name: str | None = None, seed: int | None = None) -> str:
    twin = f" of {toy.twin_of}" if toy.twin_of else ""
    header = [f"CPU twin {name or toy.name}{twin} ({study.paper or study.name}, study '{study.name}')",
              GENERATED_NOTE.replace("edit the registry, not this file", "written by tools/small_study.sh")]
    train = dict(study.toy_train, **({"seed": seed} if seed is not None else {}))
    return dump_yaml(toy_config(toy, run_dir, train, name), header)


Layout = tuple[int, int, int, int]  # (p, s, K, c) of p+s×K+c


def matched_depths(layout: Layout, depth_multiple: int) -> list[int]:
    """The effective depths a study compares its models at (Sec. 2.2 (iii): inference depth is
    matched in every comparison): the training depth L(K) and its multiples up to m·L(K)
    (D = 20, 40 for Llama; 28, 56 and, in Sec. 6 / App. D.6, 84 for Qwen). NonLoop: L only."""
    p, s, k, c = layout
    base = p + k * s + c
    return [base] if k == 1 else [j * base for j in range(1, depth_multiple + 1)]


def loops_for_depth(layout: Layout, depth: int) -> int:
    """The first r whose L(r) = p + r·s + c reaches ``depth``: r = ceil((D - p - c) / s) (>= 1).
    L(r) equals D whenever s divides D - p - c (every CoreLoop but the 3-layer cores at D = 40,
    where it is D + 1)."""
    p, s, _, c = layout
    return max(1, -(-(depth - p - c) // s))


def sweep_loops(layout: Layout, depth_multiple: int) -> list[int]:
    """Inference loop counts r = 1 .. the r that reaches m·L(K) (NonLoop: r = 1). For a BaseLoop
    that is m·K; a CoreLoop needs more (0+2x9+2 at D = 40: r = 19, not 2K = 18)."""
    if layout[2] == 1:
        return [1]
    return list(range(1, loops_for_depth(layout, matched_depths(layout, depth_multiple)[-1]) + 1))


def probe_loops(layout: Layout, depth_multiple: int) -> list[int]:
    """r for the geometry probes (App. C.4 compares under-unrolling, K, extrapolation): 1, K/2 and
    the r reaching each matched depth (K, then e.g. 19 for 0+2x9+2 at D = 40, Fig. 8(a))."""
    k = layout[2]
    return sorted({1, max(1, k // 2)} | {loops_for_depth(layout, d) for d in matched_depths(layout, depth_multiple)})


def sweep_summary(layout: Layout, depth_multiple: int) -> str:
    """``r 1-19 (D 20 @ r 9, 40 @ r 19)``: the sweep and the r at each matched depth (its L(r) when
    it overshoots), as --list-configs and docs/REPRODUCE.md show it."""
    p, s, _, c = layout
    loops = sweep_loops(layout, depth_multiple)
    hits = []
    for d in matched_depths(layout, depth_multiple):
        r = loops_for_depth(layout, d)
        reached = p + r * s + c
        hits.append(f"{d} @ r {r}" + (f" (L = {reached})" if reached != d else ""))
    span = "r 1" if len(loops) == 1 else f"r 1-{loops[-1]}"
    return f"{span} (D {', '.join(hits)})"


def run_depth_multiple(name: str) -> int:
    """The largest depth multiple among the studies that evaluate ``name`` (2 when none)."""
    family = RUNS[name].family
    return max((s.multiple_for(family) for s in STUDY_LIST if name in s.runs and not s.params_only), default=2)


# --------------------------------------------------------------------------------------
# Parameters: ONE call site (dry-run's count today; an analytic count can replace it here)
# --------------------------------------------------------------------------------------


def parameter_counts(model_fields: dict[str, Any]) -> tuple[int, int]:
    """(all trainable parameters, backbone parameters without conditioning) of a model section."""
    return count_parameters(build_model_config(model_fields))


def list_configs() -> str:
    """The table ``pretrain_loop.py --list-configs`` prints."""
    rows = [("name", "family", "kind", "layout", "L_phys", "L(K)", "conditioning", "params", "loop sweep", "paper")]
    for run in RUNS.values():
        params, _ = parameter_counts(run.model_fields())
        rows.append((run.name, run.fam.label, run.kind, f"{run.prelude}+{run.core}x{run.loops}+{run.coda}",
                     str(run.physical_depth), str(run.effective_depth), run.conditioning.label, f"{params:,}",
                     sweep_summary(run.layout_tuple, run_depth_multiple(run.name)),
                     (", ".join(paper_refs(run.name)) or "— (" + ", ".join(
                         s.name for s in STUDY_LIST if run.name in s.runs) + ")")
                     + (" (assumed recipe*)" if is_pilot(run) else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    figures = {ref for run in RUNS for ref in paper_refs(run)}
    lines.append("* optimizer pilot (App. D.1 gives no recipe): " + "; ".join(
        f"{section}.{key} {note.removeprefix('assumed: ').removeprefix('assumed ')}"
        for (section, key), note in PILOT_ASSUMPTIONS.items() if note.startswith("assumed"))
        + f"; budget: {PILOT_BUDGET}")
    lines.append("loop sweep: r swept at inference and the r at which L(r) = p + r·s + c reaches each matched "
                 "depth D (Sec. 2.2 (iii)); L is shown where it overshoots D")
    lines.append(f"{len(RUNS)} runs behind {len(figures)} paper figures/tables; studies: {', '.join(STUDIES)} "
                 "(bash tools/small_study.sh STUDY)")
    return "\n".join(lines)


