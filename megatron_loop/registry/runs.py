"""Every model the paper trains, by name (:data:`RUNS`): the layouts of Secs. 3-4 and App. C.1,
the conditioning ablations of Secs. 5-6 and App. D.3-D.6, E.1, and the optimizer pilot (App. D.1)."""

from __future__ import annotations

from megatron_loop.registry.architectures import Conditioning, Run, baseloop_layout, make_run
from megatron_loop.registry.pilot import pilot_runs
from megatron_loop.registry.recipes import FAMILIES

# ---- layouts (Sec. 3-4, App. C.1 "BaseLoop and CoreLoop models", Table 2)
BASELOOP_CORES = {"llama": (2, 4, 5, 10), "qwen": (2, 4, 7, 14)}
CORELOOPS = {
    "llama": [(0, 1, 19, 1), (1, 1, 19, 0),
              (0, 2, 9, 2), (1, 2, 9, 1), (2, 2, 9, 0),
              (0, 3, 6, 2), (1, 3, 6, 1), (2, 3, 6, 0),
              *[(p, 5, 3, 5 - p) for p in range(6)]],
    "qwen": [(0, 2, 13, 2), (1, 2, 13, 1), (2, 2, 13, 0)],
}
# ---- conditioning variants (Sec. 5, App. C.1)
INITIAL = ("scalar", "channel", "residual_channel", "dense")
TIMESTEP = ("loop_gating", "branch_gating", "adaln")
WINDOWS = (1, 2, 4)
HISTORY = ("scalar", "channel", "dense")
GATES = ("loop_gating", "branch_gating")
# The one layout every history and combination ablation uses (Sec. 5.1, 6; App. D.4, D.6).
QWEN_4X7 = baseloop_layout("qwen", 4)

FIG17_NOTE = ("Fig. 17's caption says dense initial-state injection; the scores App. D.6 quotes for "
              "I+LG / I+BG (36.33 / 35.68 at D = 84 = channel-wise I alone, 36.20, +0.13 / -0.52) are "
              "channel-wise ones: both are registered")


def family_runs(family: str) -> list[Run]:
    """NonLoop reference, BaseLoops, CoreLoops; every BaseLoop with each initial-state injection
    and each timestep conditioning."""
    cores = BASELOOP_CORES[family]
    runs = [make_run(family, (0, FAMILIES[family].effective_depth, 1, 0))]  # NonLoop reference (Table 1)
    runs += [make_run(family, baseloop_layout(family, s)) for s in cores]
    runs += [make_run(family, layout) for layout in CORELOOPS[family]]
    # initial-state injection x 4 for every BaseLoop (App. C.1, Figs. 4, 13, Tables 8-9)
    runs += [make_run(family, baseloop_layout(family, s), Conditioning(initial=i)) for s in cores for i in INITIAL]
    # timestep conditioning for every BaseLoop (Qwen: Fig. 6, Table 12; Llama: Table 11 = 4x5)
    runs += [make_run(family, baseloop_layout(family, s), Conditioning(timestep=t)) for s in cores for t in TIMESTEP]
    return runs


def qwen_4x7_ablation_runs() -> list[Run]:
    """History-state injection and the combinations, all on Qwen 4x7 (Sec. 5.1, 6; App. D.4, D.6, E.1)."""
    def run(conditioning: Conditioning, note: str = "") -> Run:
        return make_run("qwen", QWEN_4X7, conditioning, note=note)

    # history-state injection (Fig. 5, Table 10)
    runs = [run(Conditioning(history=h, window=w)) for h in HISTORY for w in WINDOWS]
    # initial + history, same parameterisation (Figs. 14-16)
    runs += [run(Conditioning(initial=h, history=h, window=w)) for h in HISTORY for w in WINDOWS]
    # initial + timestep: channel-wise (Fig. 7, numbers of App. D.6) and dense (Fig. 17's caption)
    runs += [run(Conditioning(initial=i, timestep=t), FIG17_NOTE if i == "dense" else "")
             for i in ("channel", "dense") for t in GATES]
    # history + timestep: channel-wise w = 1, 2, 4 (Figs. 7, 19, 20), dense w = 1, 2 (Fig. 18)
    runs += [run(Conditioning(history="channel", window=w, timestep=t)) for t in GATES for w in WINDOWS]
    runs += [run(Conditioning(history="dense", window=w, timestep=t)) for t in GATES for w in (1, 2)]
    # all three, channel-wise, w = 1, 2 (Figs. 7, 21)
    runs += [run(Conditioning(initial="channel", history="channel", window=w, timestep=t))
             for t in GATES for w in (1, 2)]
    # initialisation-noise ablation (App. E.1, Fig. 22)
    runs += [run(Conditioning(initial=i, init_noise=0.03)) for i in ("scalar", "channel", "residual_channel")]
    return runs


def paper_runs() -> list[Run]:
    return [*family_runs("llama"), *family_runs("qwen"), *qwen_4x7_ablation_runs(), *pilot_runs()]


RUNS: dict[str, Run] = {}
for _run in paper_runs():
    if _run.name in RUNS:
        raise AssertionError(f"duplicate registry name {_run.name}")
    RUNS[_run.name] = _run
