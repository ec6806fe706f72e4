"""``--mode sweep``: what a loop sweep costs (``tools/eval_loops.py``), side by side.

* one-pass vs per-r: the forwards of a sweep over r = 1..R (``--sweep-loops``) of the HF export of
  the family's paper LoopLM (Llama 4x5 at CPU widths): one forward at R that reads Coda + head after
  every loop (``loop_readouts``, what a sweep of a model whose trajectory does not depend on r runs)
  against one forward per r (R(R+1)/2 loops). Timed as the peers mode times (``peers.measure_shuffled``:
  each round runs both in a shuffled order; process CPU time on CPU); the ratio is the paired one with
  its interquartile range.
* probe sweep: the App. C.4 geometry probes (``tools/probe_geometry.py``, every metric with skip runs
  of every occurrence, ``--interaction-sources all``) of the same model over the same r, on micro-batch
  sequences of seq tokens, every position selected, one chunk: one pass for every r (``probes/runner.py``:
  the forwards at r_max, a Coda readout per smaller r) against one pass per r (``--per-r``), paired as above.
* eval start-up: lm-eval's ``TaskManager`` as a sweep builds it (``eval.harness.task_manager``), in a
  fresh process each time, for local tasks only (ours and an include folder: ``include_defaults=False``)
  against the same with one stock task (lm-eval's ~14,700 stock task YAMLs indexed too, what every
  sweep paid before), alternating; process CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from megatron_loop.export.convert import export_state_dict

from .harness import Case, Row, Setup, paired_ratios, release
from .models import build, loop_shape, model_config
from .peers import measure_shuffled
from .synthetic import random_tokens


def bench_sweep_forwards(setup: Setup, family: str, loops: list[int]) -> list[Row]:
    core, train_loops = loop_shape(family)
    cfg = model_config(setup, family, core, train_loops, compile=False)
    model = build(cfg, setup).eval()
    with tempfile.TemporaryDirectory() as tmp:
        state = {k: v.float().cpu() for k, v in model.state_dict().items() if torch.is_tensor(v)}
        export_state_dict(state, cfg, Path(tmp) / "hf")
        hf = AutoModelForCausalLM.from_pretrained(Path(tmp) / "hf", trust_remote_code=True,
                                                  dtype=setup.dtype).to(setup.device).eval()
    del model
    tokens = random_tokens(cfg, setup)

    def per_r():
        for r in loops:
            hf(tokens, num_loops=r, use_cache=False)

    with torch.no_grad():
        m = measure_shuffled({"per-r": Case(per_r, tokens.numel() * len(loops), memory=False),
                     "one-pass": Case(lambda: hf.loop_readouts(tokens, loops), tokens.numel() * len(loops),
                                      memory=False)}, setup)
    name = f"{family} {core}x{train_loops} r={loops[0]}..{loops[-1]}"
    params = {"loops": loops, "loop_forwards_per_r": sum(loops), "loop_forwards_one_pass": max(loops),
              "batch": setup.micro_batch, "seq": setup.seq}
    rows = [Row("sweep", f"{name} {case}", params, {k: v for k, v in m[case].items() if k != "_step_times"})
            for case in m]
    # speed of per-r over one-pass = the one-pass sweep's cost as a fraction of the per-r sweep's
    ratios = paired_ratios(m["per-r"], m["one-pass"])
    rows.append(Row("sweep", f"cost {name} one-pass / per-r", params,
                    {"cost_ratio_paired": ratios["ratio_paired"], "q1": ratios["ratio_paired_q1"],
                     "q3": ratios["ratio_paired_q3"], "cost_ratio_of_medians": ratios["tokens_per_s_ratio"],
                     "loop_ratio": max(loops) / sum(loops)}))
    del hf
    release(setup)
    return rows


def bench_probe_sweep(setup: Setup, family: str, loops: list[int]) -> list[Row]:
    """The geometry probes' cost over r = ``loops``: one pass for every r against one pass per r."""
    from megatron_loop.probes.runner import GeometryProbe, ProbeSettings, probe_passes
    from megatron_loop.probes.sampling import ProbeSample, select_positions

    core, train_loops = loop_shape(family)
    cfg = model_config(setup, family, core, train_loops, compile=False)
    model = build(cfg, setup).eval()
    tokens = random_tokens(cfg, setup)
    sample = ProbeSample(tokens.cpu(), select_positions(tokens.shape[0], tokens.shape[1] - 1, None))
    probes = {name: GeometryProbe(model, sample, ProbeSettings(loops=loops, batch_size=tokens.shape[0],
                                                               progress=False, one_pass=one_pass))
              for name, one_pass in (("per-r", False), ("one-pass", True))}
    modes = {name: probe_passes(model, [*loops, train_loops], one_pass).record()["mode"]  # what each case runs
             for name, one_pass in (("per-r", False), ("one-pass", True))}
    m = measure_shuffled({name: Case(probe.run, tokens.numel() * len(loops), memory=False)
                          for name, probe in probes.items()}, setup)
    name = f"probe {family} {core}x{train_loops} r={loops[0]}..{loops[-1]}"
    params = {"loops": loops, "sources": "all", "sequences": sample.num_sequences, "positions": sample.num_positions,
              "seq": setup.seq}
    rows = [Row("sweep", f"{name} {case}", {**params, "passes": modes[case]},
                {k: v for k, v in m[case].items() if k != "_step_times"}) for case in m]
    ratios = paired_ratios(m["per-r"], m["one-pass"])
    rows.append(Row("sweep", f"cost {name} one-pass / per-r", params,
                    {"cost_ratio_paired": ratios["ratio_paired"], "q1": ratios["ratio_paired_q1"],
                     "q3": ratios["ratio_paired_q3"], "cost_ratio_of_medians": ratios["tokens_per_s_ratio"]}))
    del model, probes
    release(setup)
    return rows


# One sweep's start-up in a fresh process: the imports untimed, then the harness's TaskManager for the
# tasks asked (argv[2:]) over the include folder argv[1], in process CPU and wall seconds.
_STARTUP = """
import sys, time
from megatron_loop.eval import harness
from lm_eval.tasks import TaskManager
cpu, wall = time.process_time(), time.perf_counter()
manager = harness.task_manager([sys.argv[1]], names=set(sys.argv[2:]))
print(time.process_time() - cpu, time.perf_counter() - wall, len(manager.all_tasks))
"""


def bench_eval_startup(repeats: int) -> list[Row]:
    """CPU seconds of a sweep's ``TaskManager`` (``eval.harness.task_manager``), each in a fresh process
    as every ``tools/eval_loops.py`` run builds it: for local tasks only (ours and an include folder:
    ``include_defaults=False``) and for the same plus one stock task (lm-eval's whole catalogue indexed),
    alternating, ``repeats`` times each."""
    import os
    import subprocess
    import sys

    cases = {"local tasks only": ["looplm_bench_local", "looplm_clutrr"],
             "with a stock task": ["looplm_bench_local", "arc_easy"]}
    times: dict[str, list[float]] = {name: [] for name in cases}
    wall: dict[str, list[float]] = {name: [] for name in cases}
    indexed: dict[str, int] = {}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with tempfile.TemporaryDirectory() as tmp:  # an --include-path folder with one local task
        (Path(tmp) / "looplm_bench_local.yaml").write_text(
            "task: looplm_bench_local\ndataset_path: json\noutput_type: multiple_choice\n")
        for _ in range(repeats):
            for name, tasks in cases.items():
                out = subprocess.run([sys.executable, "-c", _STARTUP, tmp, *tasks], capture_output=True, text=True,
                                     env=env, check=True)
                cpu_s, wall_s, count = out.stdout.split()[-3:]
                times[name].append(float(cpu_s))
                wall[name].append(float(wall_s))
                indexed[name] = int(count)
    m = {name: {"step_s": statistics.median(t), "step_s_min": min(t), "_step_times": t} for name, t in times.items()}
    rows = [Row("eval-startup", name, {"indexed_tasks": indexed[name], "repeats": repeats},
                {"cpu_s_median": m[name]["step_s"], "cpu_s_min": m[name]["step_s_min"],
                 "wall_s_median": statistics.median(wall[name])}) for name in m]
    ratios = paired_ratios(m["with a stock task"], m["local tasks only"])
    rows.append(Row("eval-startup", "cpu time local only / with a stock task", {},
                    {"ratio_paired": ratios["ratio_paired"], "q1": ratios["ratio_paired_q1"],
                     "q3": ratios["ratio_paired_q3"]}))
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return [*bench_sweep_forwards(setup, args.families[0], args.sweep_loops),
            *bench_probe_sweep(setup, args.families[0], args.sweep_loops),
            *bench_eval_startup(args.startup_repeats)]
