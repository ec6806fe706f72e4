#!/usr/bin/env python
"""Training-step benchmarks of megatron_loop; figures go to docs/BENCHMARKS.md.

    python tools/bench.py --device cpu --mode all --json bench_cpu.json
    python tools/bench.py --device cuda --mode loop-vs-nonloop --compile --json bench_gpu.json
    torchrun --nproc_per_node 2 tools/bench.py --mode tp --config examples/qwen_4x7.yaml --tp 1,2 \\
        --micro-batch 4 --json bench_tp.json

A training step is forward + backward (+ optimizer step), timed after warm-up with the device
synchronised at step boundaries only; the median over ``--steps`` is reported. Throughput is
tokens/s, achieved TFLOP/s counts model FLOPs over the effective depth L(K)
(``megatron_loop.flops``), MFU divides by 989 TFLOP/s on CUDA (H100/H200 dense bf16) and, on
CPU, by a measured matmul throughput of the same dtype (labelled ``mfu_vs_matmul``). Peak
memory is the peak above what was allocated when the step started (activations, gradients,
transient buffers; ``measure.memory.peak_memory_delta``), measured in one extra step.

Modes (each case of a mode runs in this one process, side by side):
  loop-vs-nonloop  LoopLM vs NonLoop at equal effective depth (Llama 4x5 vs 20x1, Qwen 4x7 vs 28x1)
  checkpointing    activation recomputation none / per_loop / selective / auto / per_block across K (the
                   none case optionally at a smaller --ac-reference-micro-batch, for micro-batches it cannot fit)
  recompute        what recomputation costs under each per-loop checkpointing kind, in forwards of the
                   recomputed loop (the cost the auto planner ranks plans by)
  optimizer        Muon+AdamW vs AdamW step time as a fraction of an accumulated global-batch step
  data             loader samples/s; preprocessing tokens/s vs the bare tokenizer
  eval             forward throughput of the HF export at several r
  compile          eager vs torch.compile'd blocks; graphs compiled when r changes (must be 0)
  peers            our step vs HF transformers LlamaForCausalLM / Qwen3ForCausalLM at the same widths,
                   depth (p+Ks+c layers) and micro-batch, eager (and torch.compile'd with --compile)
  train            the real training path (build_engine, DeepSpeed) on a shipped example config
                   (--config), its micro-batch and checkpointing; reports what metrics.jsonl reports
  profile          torch.profiler table of one step of --config's model: top ops, share of the step
  loss             LM head + cross-entropy alone: chunked torch reference vs Liger's fused kernel (CUDA)
  backprop         truncated backpropagation: backprop_loops 1, K/2, K vs full at K loops
  exit-decode      greedy decode tokens/s of an HF export: fixed r vs per-token adaptive exit
  sweep            a loop sweep's forwards over r = --sweep-loops of the HF export: one forward at the
                   largest r reading out every r (loop_readouts) vs one forward per r; the geometry
                   probes over the same r, one pass for every r vs one per r; and the eval
                   start-up: lm-eval's TaskManager over local tasks only vs with its stock tasks
  tp               tensor-parallel step time of --config's model at each --tp size, per GPU, with the TP
                   bytes the byte model predicts (under a launcher: torchrun --nproc_per_node 2 ...)
CPU mode shrinks the models (same block structure, small widths, short sequences); CUDA mode
uses the paper's backbones at seq 2048 in bf16.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

# tools/ holds the benchmarks package, which is not installed (megatron_loop is): already first on the path
# when this file runs as a script, not when a test loads it by its path
TOOLS = str(Path(__file__).resolve().parent)
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from megatron_loop.cli import host_cores, parse_loop_counts, run_cli  # noqa: E402
from megatron_loop.config import RECOMPUTE_MODES  # noqa: E402
from megatron_loop.config.validation import MAX_LOOPS  # noqa: E402
from megatron_loop.errors import LoopConfigError  # noqa: E402

from benchmarks.harness import Row, fail, make_setup  # noqa: E402
from benchmarks.rendering import report  # noqa: E402

# --mode value: its module in tools/benchmarks/, imported only when the mode runs
MODES = {
    "loop-vs-nonloop": "loop_vs_nonloop",
    "checkpointing": "checkpointing",
    "recompute": "recompute",
    "optimizer": "optimizer",
    "data": "data",
    "eval": "export_forward",
    "compile": "compiled_blocks",
    "peers": "peers",
    "train": "train",
    "profile": "op_profile",
    "loss": "loss",
    "backprop": "backprop",
    "exit-decode": "exit_decode",
    "sweep": "loop_sweep",
    "tp": "tensor_parallel",
}
# "all": every side-by-side mode in this process (train starts its own engine: run it alone;
# exit-decode needs a trained export, --hf-model; tp needs a launcher's world of several ranks)
NOT_IN_ALL = ("train", "exit-decode", "tp")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Modes: " + ", ".join(MODES) + ". Figures: docs/BENCHMARKS.md.")
    ap.add_argument("--mode", default="all", help=f"comma list of {', '.join(MODES)}, or 'all'")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--families", default=None, help="comma list of llama,qwen (default: both on cuda, llama on cpu)")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default 2048 cuda, 128 cpu)")
    ap.add_argument("--micro-batch", type=int, default=None, help="sequences per micro-batch (default 8 cuda, 4 cpu)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10 cuda, 9 cpu)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed warm-up steps (default 3 cuda, 1 cpu)")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU: torch threads (default 1: on a shared machine more threads mostly add noise)")
    ap.add_argument("--engine", choices=("plain", "deepspeed"), default="plain",
                    help="full training steps: the model with MuonAdamW (plain) or the DeepSpeed engine of "
                         "megatron_loop.optim.build_engine (ZeRO-1, bf16 master weights on CUDA)")
    ap.add_argument("--compile", action="store_true", help="model.compile=true: torch.compile each block")
    ap.add_argument("--loops", default=None,
                    help="K values for checkpointing (default 5,10 cuda, 2,4,8 cpu); backprop, recompute: the last")
    ap.add_argument("--eval-loops", default="1,2,4,8", help="r values for the eval mode")
    ap.add_argument("--sweep-loops", default="1,2,3,4,5,6,7,8,9,10", help="r values of the sweep mode")
    ap.add_argument("--startup-repeats", type=int, default=5,
                    help="sweep mode: interleaved builds of lm-eval's TaskManager each way")
    ap.add_argument("--accumulation", type=int, default=None,
                    help="micro-batches of the measured accumulated step (default 6 cuda, 4 cpu)")
    ap.add_argument("--data-input", default=None, help="documents for the data mode (default: generated corpus)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer for --data-input (default: one trained on it)")
    ap.add_argument("--workers", type=int, default=1, help="preprocessing workers for the data mode")
    ap.add_argument("--config", default="examples/llama_4x5.yaml", help="shipped example for --mode train/profile/tp")
    ap.add_argument("--data-prefix", default=None,
                    help="indexed dataset for --mode train (default: random tokens below the vocabulary)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for --mode train (repeatable), e.g. --set model.compile=true")
    ap.add_argument("--ac-budget-gib", type=float, default=None,
                    help="recompute=auto budget in the checkpointing mode (default: midway)")
    ap.add_argument("--ac-modes", default=",".join(RECOMPUTE_MODES),
                    help="recompute modes of the checkpointing mode (comma list)")
    ap.add_argument("--ac-reference-micro-batch", type=int, default=None,
                    help="checkpointing mode: run the none case at this micro-batch (one that fits unconstrained); "
                         "time_vs_none is then per token")
    ap.add_argument("--top", type=int, default=12, help="rows of the profile table")
    ap.add_argument("--json", default=None, help="write every figure and its provenance here")
    ap.add_argument("--hf-model", default=None, help="exit-decode: an HF export (tools/convert_to_hf.py)")
    ap.add_argument("--valid-prefix", default=None, help="exit-decode: indexed prefix the prompts come from")
    ap.add_argument("--exits", default="kl:1e-2", help="exit-decode: comma list of criterion:threshold")
    ap.add_argument("--tp", default="1,2", help="tp: tensor-parallel sizes to compare (comma list; each divides "
                                                "the launcher's world)")
    ap.add_argument("--sequence-parallel", action="store_true", help="tp: sequence parallelism at every TP size > 1")
    return ap


def selected_modes(mode_arg: str) -> tuple[str, ...]:
    modes = tuple(m for m in MODES if m not in NOT_IN_ALL) if mode_arg == "all" else tuple(
        m.strip() for m in mode_arg.split(","))
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        fail(f"--mode {unknown[0]!r}: expected one of {', '.join(MODES)} or 'all'")
    return modes


# Options only some modes read (default None: given or not is known) -> those modes; given to none of the
# selected modes they are refused, not ignored (--mode train --loops 0 ran the config's own K)
MODE_FLAGS = {
    "loops": ("checkpointing", "recompute", "backprop"), "accumulation": ("optimizer", "train"),
    "ac_budget_gib": ("checkpointing",), "ac_reference_micro_batch": ("checkpointing",),
    "data_input": ("data",), "tokenizer": ("data",), "data_prefix": ("train",),
    "hf_model": ("exit-decode",), "valid_prefix": ("exit-decode",),
}
# Counts and their smallest values, checked before any model is built
COUNTS = {"seq": 2, "micro_batch": 1, "steps": 1, "warmup": 0, "threads": 1, "accumulation": 1, "workers": 1,
          "startup_repeats": 1, "top": 1}
FAMILIES = ("llama", "qwen")


def resolve_lists(args: argparse.Namespace) -> None:
    """The comma-list arguments as lists, with the device's defaults, checked before anything runs."""
    cuda = args.device == "cuda"
    args.families = args.families.split(",") if args.families else (["llama", "qwen"] if cuda else ["llama"])
    if not args.families or any(f not in FAMILIES for f in args.families):
        fail(f"--families {','.join(args.families)!r}: expected a comma list of {', '.join(FAMILIES)}")
    try:
        args.loops = parse_loop_counts(args.loops or ("5,10" if cuda else "2,4,8"), "--loops")
        args.eval_loops = parse_loop_counts(args.eval_loops, "--eval-loops")
        args.sweep_loops = parse_loop_counts(args.sweep_loops, "--sweep-loops")
        args.tp = parse_loop_counts(args.tp, "--tp")
    except LoopConfigError as e:
        fail(str(e))
    for flag in ("loops", "eval_loops", "sweep_loops"):
        if max(getattr(args, flag)) > MAX_LOOPS:
            fail(f"--{flag.replace('_', '-')} {max(getattr(args, flag))}: expected loop counts of at most {MAX_LOOPS}")


def check_unread_flags(modes: tuple[str, ...], args: argparse.Namespace) -> None:
    """Before the device defaults fill them in: an option none of ``modes`` reads is refused."""
    for flag, readers in MODE_FLAGS.items():
        if getattr(args, flag) is not None and not set(readers) & set(modes):
            fail(f"--{flag.replace('_', '-')}: read only by --mode {', '.join(readers)}; expected it with one of "
                 f"them (--mode {','.join(modes)})")


def check_mode_arguments(modes: tuple[str, ...], args: argparse.Namespace) -> None:
    for flag, low in COUNTS.items():
        value = getattr(args, flag)
        if value is not None and value < low:
            fail(f"--{flag.replace('_', '-')} {value}: expected an integer >= {low}")
    if args.threads > host_cores() or args.workers > host_cores():
        flag, value = ("--threads", args.threads) if args.threads > host_cores() else ("--workers", args.workers)
        fail(f"{flag} {value}: expected at most the {host_cores()} CPU cores this process may use")
    if args.ac_budget_gib is not None and not 0 < args.ac_budget_gib < float("inf"):
        fail(f"--ac-budget-gib {args.ac_budget_gib}: expected a positive number of GiB")
    unknown = [m for m in args.ac_modes.split(",") if m not in RECOMPUTE_MODES]
    if unknown:
        fail(f"--ac-modes {args.ac_modes!r}: expected a comma list of {', '.join(RECOMPUTE_MODES)}")
    if "recompute" in modes and args.loops[-1] < 2:
        fail(f"--mode recompute: expected --loops K >= 2 (K - 1 loops are recomputed), got {args.loops[-1]}")
    if args.ac_reference_micro_batch is not None and args.ac_reference_micro_batch < 1:
        fail(f"--ac-reference-micro-batch {args.ac_reference_micro_batch}: expected a positive integer")
    if "exit-decode" in modes and not (args.hf_model and args.valid_prefix):
        fail("--mode exit-decode: expected --hf-model DIR and --valid-prefix P")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    modes = selected_modes(args.mode)
    check_unread_flags(modes, args)
    resolve_lists(args)
    check_mode_arguments(modes, args)
    setup = make_setup(args)
    rows: list[Row] = []
    for mode in modes:
        start = time.perf_counter()
        rows += importlib.import_module(f"benchmarks.{MODES[mode]}").run(setup, args)
        print(f"[bench] {mode}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    if not dist.is_initialized() or dist.get_rank() == 0:  # under a launcher: one report, rank 0's figures
        report(setup, argv, rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
