#!/usr/bin/env python
"""Training-step benchmarks of megatron_loop (issue 8); figures go to docs/BENCHMARKS.md.

    python tools/bench.py --device cpu --mode all --json bench_cpu.json
    python tools/bench.py --device cuda --mode loop-vs-nonloop --compile --json bench_gpu.json

A training step is forward + backward (+ optimizer step), timed after warm-up with the device
synchronised at step boundaries only; the median over ``--steps`` is reported. Throughput is
tokens/s, achieved TFLOP/s counts model FLOPs over the effective depth L(K)
(``megatron_loop.flops``), MFU divides by 989 TFLOP/s on CUDA (H100/H200 dense bf16) and, on
CPU, by a measured matmul throughput of the same dtype (labelled ``mfu_vs_matmul``). Peak
memory is the peak above what was allocated when the step started (activations, gradients,
transient buffers; ``perf.peak_memory_delta``), measured in one extra step.

Modes (each case of a mode runs in this one process, side by side):
  loop-vs-nonloop  LoopLM vs NonLoop at equal effective depth (Llama 4x5 vs 20x1, Qwen 4x7 vs 28x1)
  checkpointing    activation checkpointing none / per_loop / selective / auto / per_block across K (the
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
  backprop         truncated backpropagation: backprop_loops 1, K/2, K vs full at K loops (issue 15)
  exit-decode      greedy decode tokens/s of an HF export: fixed r vs per-token adaptive exit (issue 15)
CPU mode shrinks the models (same block structure, small widths, short sequences); CUDA mode
uses the paper's backbones at seq 2048 in bf16.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from bench_report import cpu_name, git_commit, markdown_table, train_summary  # noqa: E402  (tools/, beside this file)

from megatron_loop.atomic import write_atomic  # noqa: E402
from megatron_loop.config import ModelConfig, build_model_config  # noqa: E402
from megatron_loop.flops import H100_BF16_PEAK_FLOPS, hardware_flops_per_token, train_flops_per_token  # noqa: E402
from megatron_loop.perf import (count_host_syncs, matmul_peak_flops, peak_memory_delta,  # noqa: E402
                                time_interleaved)

MODES = ("loop-vs-nonloop", "checkpointing", "recompute", "optimizer", "data", "eval", "compile", "peers", "train",
         "profile", "loss", "backprop", "exit-decode")
PAPER_GLOBAL_BATCH = 1824  # sequences of 2048 tokens (App. C.2): 38 micro x 6 accumulation x 8 ranks
PAPER_DATA_PARALLEL = 8

# CPU twins: the block structure of each family at widths a 2-core CPU steps in well under 1 s.
CPU_WIDTHS = dict(hidden_size=128, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, vocab_size=2048)
FAMILIES = {
    # family: (backbone on cuda, backbone on cpu, (core, loops) loop, (layers, 1) nonloop)
    "llama": ("llama3.1-1b", "tiny-llama", (4, 5), (20, 1)),
    "qwen": ("qwen3-0.6b", "tiny-qwen", (4, 7), (28, 1)),
}


@dataclass
class Setup:
    """Where and at what size a run measures."""

    device: torch.device
    dtype: torch.dtype
    seq: int
    micro_batch: int
    steps: int
    warmup: int
    compile: bool
    peak_flops: float
    peak_label: str
    engine: str = "plain"  # full steps: "plain" (model + MuonAdamW) or "deepspeed" (the training path)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


@dataclass
class Row:
    """One measured configuration."""

    mode: str
    case: str
    params: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- models and steps


def model_config(setup: Setup, family: str, core: int, loops: int, **overrides) -> ModelConfig:
    gpu_backbone, cpu_backbone, _, _ = FAMILIES[family]
    values = dict(backbone=gpu_backbone if setup.cuda else cpu_backbone, core_layers=core, train_loops=loops,
                  activation_checkpointing="none", compile=setup.compile)
    if not setup.cuda:
        values.update(CPU_WIDTHS)
    values.update(overrides)
    return build_model_config(values)


def build(cfg: ModelConfig, setup: Setup) -> torch.nn.Module:
    from megatron_loop.model import build_model

    torch.manual_seed(0)
    return build_model(cfg).to(device=setup.device, dtype=setup.dtype).train()


def muon_adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    """The paper's optimizer (App. C.2). Clipping stays with DeepSpeed in training (ZeRO >= 1),
    so it is off here; the optimizer's own clip would read the norm back to the host."""
    from megatron_loop.optim import OptimizerSettings, build_optimizer

    return build_optimizer(model, OptimizerSettings(lr=1e-4), clip_in_optimizer=False)


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    """Plain AdamW over every parameter, the fused kernel on CUDA (the fastest AdamW torch has)."""
    extra = {"fused": True} if next(model.parameters()).is_cuda else {"foreach": True}
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, **extra)


def batch(cfg: ModelConfig, setup: Setup, micro_batch: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab_size, (micro_batch or setup.micro_batch, setup.seq), generator=g)
    return tokens.to(setup.device)


def forward_backward(model: torch.nn.Module, tokens: torch.Tensor, scale: float = 1.0) -> None:
    loss = model(tokens, labels=tokens, compute_logits=False).loss
    if scale != 1.0:  # gradient accumulation: the engine divides by the micro-batch count
        loss = loss * scale
    loss.backward()


def deepspeed_step(cfg: ModelConfig, setup: Setup, tokens: torch.Tensor) -> Callable[[], None]:
    """A full step through the training path: a fresh model in ``build_engine``'s DeepSpeed engine
    (ZeRO-1, bf16 with fp32 master weights on CUDA, fp32 on CPU), MuonAdamW, clipping in ZeRO."""
    from megatron_loop.optim import OptimizerSettings, build_engine

    engine = build_engine(build(cfg, setup), OptimizerSettings(lr=1e-4), micro_batch_size=tokens.shape[0],
                          grad_accum=1, total_steps=10**6, bf16=setup.cuda, zero_stage=1).engine

    def step() -> None:
        loss = engine(tokens, labels=tokens, compute_logits=False).loss
        engine.backward(loss)
        engine.step()

    return step


def full_step(model: torch.nn.Module, cfg: ModelConfig, setup: Setup, tokens: torch.Tensor) -> Callable[[], None]:
    """Forward + backward + Muon+AdamW, on ``model`` (plain) or through a DeepSpeed engine."""
    if setup.engine == "deepspeed":
        return deepspeed_step(cfg, setup, tokens)
    return train_step(model, muon_adamw(model), tokens)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, tokens: torch.Tensor,
               accumulation: int = 1) -> Callable[[], None]:
    """A full step: ``accumulation`` forward/backward passes, then the optimizer step."""

    def step() -> None:
        for _ in range(accumulation):
            forward_backward(model, tokens, 1.0 / accumulation)
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)

    return step


@dataclass
class Case:
    """A step to time: what it runs, how many tokens it consumes, its model FLOPs per token."""

    step: Callable[[], None]
    tokens: int
    flops_per_token: float | None = None
    memory: bool = True
    check_syncs: bool = False  # CUDA: count synchronising calls in one step (target: 0 in the model)


def measure(cases: dict[str, Case], setup: Setup) -> dict[str, dict]:
    """Time every case side by side (interleaved), then measure each one's step peak memory."""
    times = time_interleaved({name: c.step for name, c in cases.items()}, setup.device, setup.steps, setup.warmup)
    out = {}
    for name, case in cases.items():
        median = statistics.median(times[name])
        m = {"step_s": median, "step_s_min": min(times[name]), "tokens_per_s": case.tokens / median,
             "_step_times": times[name]}
        if case.flops_per_token is not None:
            achieved = case.tokens * case.flops_per_token / median
            m["tflops"] = achieved / 1e12
            m["mfu" if setup.cuda else "mfu_vs_matmul"] = achieved / setup.peak_flops
        if case.memory:
            m["peak_step_mib"] = peak_memory_delta(case.step, setup.device) / 2**20
        if case.check_syncs:  # CUDA: sync debug mode; CPU: perf.HostSyncDetector (aten-level reads)
            where: list[str] = []
            m["host_syncs"] = count_host_syncs(case.step, setup.device, where)
            if where:
                m["host_sync_sites"] = sorted(set(where))
        out[name] = m
    return out


def speed_ratios(a: dict, b: dict) -> dict:
    """Throughput of ``a`` over ``b`` (equal tokens per step), three ways from one interleaved run:
    ratio of medians; ratio of best steps (the least disturbed); and ``ratio_paired``, the median
    over rounds of the ratio of the two steps timed back to back (most robust to load bursts
    on a shared machine, which hit both members of a pair alike)."""
    paired = statistics.median(tb / ta for ta, tb in zip(a["_step_times"], b["_step_times"]))
    return {"tokens_per_s_ratio": b["step_s"] / a["step_s"], "ratio_best_steps": b["step_s_min"] / a["step_s_min"],
            "ratio_paired": paired}


def release(setup: Setup) -> None:
    if setup.cuda:
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- modes


def bench_loop_vs_nonloop(setup: Setup, families: list[str]) -> list[Row]:
    """Equal effective depth, equal FLOPs: the loop's only extra cost is re-entering the shared
    blocks. ``model`` steps are forward + backward (the FLOPs-equal comparison the target is
    about); ``full`` steps add Muon+AdamW, which is cheaper for the loop (fewer matrices)."""
    rows = []
    for family in families:
        _, _, loop, nonloop = FAMILIES[family]
        cases, info = {}, {}
        for core, loops in (loop, nonloop):
            cfg = model_config(setup, family, core, loops)
            model = build(cfg, setup)
            tokens = batch(cfg, setup)
            flops = train_flops_per_token(cfg, setup.seq)
            name = f"{family} {core}x{loops}"
            info[name] = {"effective_depth": cfg.effective_depth(), "params_m": model.num_parameters() / 1e6}
            cases[f"{name} model"] = Case(train_step(model, None, tokens), tokens.numel(), flops, check_syncs=True)
            cases[f"{name} full"] = Case(full_step(model, cfg, setup, tokens), tokens.numel(), flops)
        measured = measure(cases, setup)
        for name, metrics in measured.items():
            rows.append(Row("loop-vs-nonloop", name, info[name.rsplit(" ", 1)[0]], metrics))
        a, b = info
        for kind in ("model", "full"):
            ratios = speed_ratios(measured[f"{a} {kind}"], measured[f"{b} {kind}"])
            rows.append(Row("loop-vs-nonloop", f"ratio {a} / {b} ({kind})", {},
                            {**ratios, "target": ">= 0.97" if kind == "model" else "-"}))
        del cases
        release(setup)
    return rows


def _midway_budget_gib(cfg: ModelConfig, setup: Setup, loops: int) -> float:
    """Halfway between per_loop's and none's peak, as the memory model predicts them."""
    from megatron_loop.model.checkpointing import FULL, NONE, loop_memory, predicted_peak

    params = build(cfg, setup).num_parameters() * setup.dtype.itemsize
    mem = loop_memory(cfg, setup.micro_batch, setup.seq, setup.dtype.itemsize, 4096, params)
    low = predicted_peak((FULL,) * (loops - 1) + (NONE,), mem)
    return (low + predicted_peak((NONE,) * loops, mem)) / 2 / 2**30


AC_MODES = ("none", "per_loop", "selective", "auto", "per_block")


def fits(step: Callable[[], None], model: torch.nn.Module, setup: Setup) -> bool:
    """One untimed call of ``step``; False (its memory given back) if it ran out of device memory."""
    try:
        step()
    except torch.cuda.OutOfMemoryError:
        model.zero_grad(set_to_none=True)
        release(setup)
        return False
    return True


def bench_checkpointing(setup: Setup, family: str, loops_list: list[int], ac_budget_gib: float | None = None,
                        modes: tuple[str, ...] = AC_MODES, reference_micro_batch: int | None = None) -> list[Row]:
    """Every checkpointing mode at each K: step time (forward + backward) and step peak memory.

    ``auto`` runs with ``--ac-budget-gib`` (default: halfway between per_loop's and none's peak as
    the memory model predicts them), so the planner has to mix loop kinds.

    ``reference_micro_batch``: the unconstrained reference (``none``) runs at this micro-batch (one
    that fits without checkpointing, e.g. 8 when the paper's 38 does not), so ``time_vs_none`` is
    per token: tokens/s of none over tokens/s of the mode (the step ratio at equal micro-batches).

    Per-loop checkpointing should add one stored loop input ``h_l`` ([seq, batch, hidden]) per
    extra loop; ``loop_inputs_per_loop`` is the peak's growth per loop in those units. A mode whose
    step runs out of device memory is reported as such (``fits: false``) and left out of the timing.
    """
    rows = []
    core = FAMILIES[family][2][0]
    for loops in loops_list:
        cases, cfgs, plans, micro, too_big = {}, {}, {}, {}, []
        for mode in modes:
            extra = {}
            if mode == "auto":
                extra["activation_checkpointing_budget_gib"] = ac_budget_gib or _midway_budget_gib(
                    model_config(setup, family, core, loops), setup, loops)
            cfg = cfgs[mode] = model_config(setup, family, core, loops, activation_checkpointing=mode, **extra)
            model = build(cfg, setup)
            tokens = batch(cfg, setup, reference_micro_batch if mode == "none" else None)
            micro[mode] = tokens.shape[0]
            step = train_step(model, None, tokens)
            if not fits(step, model, setup):  # one untimed step (auto: plans the loops)
                too_big.append(mode)
                continue
            cases[mode] = Case(step, tokens.numel(), train_flops_per_token(cfg, setup.seq))
            if mode == "auto":
                plans[mode] = next(iter(model._checkpoint_plans.values()))
        measured = measure(cases, setup)
        for mode in modes:
            name = f"{family} {core}x{loops} {mode}" + (f" (micro-batch {micro[mode]})"
                                                        if micro[mode] != setup.micro_batch else "")
            params = {"K": loops, "mode": mode, "micro_batch": micro[mode]}
            if mode in too_big:
                rows.append(Row("checkpointing", name, params, {"fits": False}))
                continue
            m = measured[mode]
            if "none" in measured:  # per token: the reference may run another micro-batch
                m["time_vs_none"] = measured["none"]["tokens_per_s"] / m["tokens_per_s"]
            # hardware TFLOP/s: model FLOPs plus the recomputed forward
            full = sum(k == "full" for k in plans[mode].kinds) if mode in plans else None
            m["hw_tflops"] = m["tokens_per_s"] * hardware_flops_per_token(cfgs[mode], setup.seq,
                                                                          full_loops=full) / 1e12
            m["loop_input_mib"] = micro[mode] * setup.seq * cfgs[mode].hidden_size * setup.dtype.itemsize / 2**20
            if mode in plans:
                m["plan"] = "/".join(k[0] for k in plans[mode].kinds)  # n(one) s(elective) f(ull) per loop
                m["predicted_peak_mib"] = plans[mode].peak_bytes / 2**20
                m["budget_mib"] = cfgs[mode].activation_checkpointing_budget_gib * 1024
            rows.append(Row("checkpointing", name, params, m))
        del cases
        release(setup)
    for mode in modes:
        pts = [(r.params["K"], r.metrics) for r in rows
               if r.params.get("mode") == mode and "peak_step_mib" in r.metrics]
        if len(pts) >= 2:
            (k0, m0), (k1, m1) = pts[0], pts[-1]
            per_loop = (m1["peak_step_mib"] - m0["peak_step_mib"]) / (k1 - k0)
            rows.append(Row("checkpointing", f"{mode}: peak growth per added loop (K={k0}..{k1})", {},
                            {"mib_per_loop": per_loop, "loop_inputs_per_loop": per_loop / m0["loop_input_mib"]}))
    return rows


RECOMPUTED_KINDS = ("selective", "per_loop")  # the per-loop checkpointing kinds that recompute


def bench_recompute(setup: Setup, family: str, loops: int) -> list[Row]:
    """What recomputation costs, in forwards of the loop it recomputes (the unit of the ``auto``
    planner's cost of a loop kind, ``megatron_loop/model/checkpointing.py``).

    One model per mode (same weights) at K loops; every per-loop mode recomputes K - 1 loops (the
    last never), so for each kind ``recompute_cost`` = (t_step(kind) - t_step(none)) / ((K - 1) t_loop),
    where t_loop, one loop's forward, is (t_forward(r=K) - t_forward(r=1)) / (K - 1) of the ``none``
    model (forward with autograd recording, no backward). ``per_loop`` recomputes a whole loop, so its
    cost should come out near 1 (a check of the method); ``selective``'s is the measured figure for
    the planner. ``backward_vs_none``: the step minus the forward, against none's (the backward with
    recomputation over the backward without). Steps are forward + backward, timed interleaved.
    """
    core = FAMILIES[family][2][0]
    cases: dict[str, Case] = {}
    for mode in ("none", *RECOMPUTED_KINDS):
        cfg = model_config(setup, family, core, loops, activation_checkpointing=mode)
        model = build(cfg, setup)
        tokens = batch(cfg, setup)
        cases[mode] = Case(train_step(model, None, tokens), tokens.numel(), train_flops_per_token(cfg, setup.seq),
                           memory=False)
        if mode == "none":
            for r in (loops, 1):
                cases[f"forward r={r}"] = Case(
                    lambda model=model, tokens=tokens, r=r: model(tokens, num_loops=r, labels=tokens,
                                                                  compute_logits=False),
                    tokens.numel(), memory=False)
    measured = measure(cases, setup)
    forward = measured[f"forward r={loops}"]["step_s"]
    loop_s = (forward - measured["forward r=1"]["step_s"]) / (loops - 1)
    rows = [Row("recompute", f"{family} {core}x{loops} forward, one loop", {"K": loops},
                {"step_s": loop_s, "forward_s": forward})]
    for mode in ("none", *RECOMPUTED_KINDS):
        m = measured[mode]
        extra = m["step_s"] - measured["none"]["step_s"]
        m.update(extra_s=extra, recompute_cost=extra / ((loops - 1) * loop_s) if mode != "none" else 0.0,
                 backward_vs_none=(m["step_s"] - forward) / (measured["none"]["step_s"] - forward))
        rows.append(Row("recompute", f"{family} {core}x{loops} {mode}", {"K": loops, "mode": mode}, m))
    release(setup)
    return rows


def bench_optimizer(setup: Setup, family: str, accumulation: int) -> list[Row]:
    """Optimizer-step time against an accumulated step; extrapolated to the paper's global batch.

    The optimizer step is timed on its own (gradients in place, as after the last micro-batch),
    the two optimizers side by side; forward + backward per sequence comes from the same model.
    The measured fraction is t_opt / t_step of a real ``accumulation``-micro-batch step; the
    extrapolated one at global batch G over D data-parallel ranks is t_opt / (t_opt + t_seq G / D),
    with the whole model's optimizer step on each rank (an upper bound: ZeRO shards AdamW, and
    Muon's Newton-Schulz is the same work per rank at worst).
    """
    _, _, (core, loops), _ = FAMILIES[family]
    cfg = model_config(setup, family, core, loops, activation_checkpointing="per_loop" if setup.cuda else "none")
    model = build(cfg, setup)
    tokens = batch(cfg, setup)
    forward_backward(model, tokens)  # gradients in place for the optimizer-only timings
    optimizers = {"muon+adamw": muon_adamw(model), "adamw": adamw(model)}
    for opt in optimizers.values():
        opt.step()  # create the state outside the timing
    cases = {"forward+backward": Case(lambda: forward_backward(model, tokens), tokens.numel(), memory=False)}
    cases.update({f"{n} step": Case(opt.step, tokens.numel(), memory=False) for n, opt in optimizers.items()})
    measured = measure(cases, setup)
    full = measure({n: Case(train_step(model, opt, tokens, accumulation), tokens.numel() * accumulation,
                            memory=False) for n, opt in optimizers.items()}, setup)
    t_seq = measured["forward+backward"]["step_s"] / setup.micro_batch
    rows = [Row("optimizer", f"{family} {core}x{loops} forward+backward", {"micro_batch": setup.micro_batch},
                {"step_s": measured["forward+backward"]["step_s"], "s_per_sequence": t_seq})]
    per_device = PAPER_GLOBAL_BATCH / PAPER_DATA_PARALLEL
    for name in optimizers:
        t_opt = measured[f"{name} step"]["step_s"]
        rows.append(Row("optimizer", f"{family} {core}x{loops} {name}",
                        {"accumulation": accumulation, "extrapolated": not setup.cuda or setup.seq != 2048},
                        {"step_s": t_opt, "full_step_s": full[name]["step_s"],
                         f"measured_fraction_accum{accumulation}": t_opt / full[name]["step_s"],
                         "fraction_G1824_8ranks": t_opt / (t_opt + t_seq * per_device),
                         "fraction_G1824_1rank": t_opt / (t_opt + t_seq * PAPER_GLOBAL_BATCH)}))
    del model, optimizers, cases
    release(setup)
    return rows


def bench_compile(setup: Setup, family: str) -> list[Row]:
    """Eager vs ``model.compile=true`` (inductor) side by side on the loop model, and the number
    of graphs dynamo compiled before and after evaluating at other loop counts r."""
    from torch._dynamo.utils import counters

    _, _, (core, loops), _ = FAMILIES[family]
    cases = {}
    for compiled in (False, True):
        cfg = model_config(setup, family, core, loops, compile=compiled)
        model = build(cfg, setup)
        tokens = batch(cfg, setup)
        cases["compiled" if compiled else "eager"] = Case(full_step(model, cfg, setup, tokens),
                                                          tokens.numel(), train_flops_per_token(cfg, setup.seq))
    measured = measure(cases, setup)
    measured["compiled"].update(speed_ratios(measured["compiled"], measured["eager"]))
    graphs_after_training = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        model(tokens, num_loops=loops)  # evaluation graphs (no autograd) at r = K ...
        graphs_at_k = counters["stats"]["unique_graphs"]
        for r in (1, 2 * loops, 3 * loops + 1):  # ... then at other r: no new graph
            model(tokens, num_loops=r)
    measured["compiled"].update(graphs_train=graphs_after_training, graphs_eval_r_K=graphs_at_k,
                                new_graphs_other_r=counters["stats"]["unique_graphs"] - graphs_at_k)
    del model, cases
    release(setup)
    return [Row("compile", f"{family} {core}x{loops} {name}", {}, m) for name, m in measured.items()]


def bench_data(setup: Setup, input_spec: str | None, tokenizer: str | None, workers: int) -> list[Row]:
    """Loader and preprocessing throughput (the data package's own measurement functions)."""
    from megatron_loop.data.loaders import measure_loader_throughput
    from megatron_loop.data.preprocess import PreprocessOptions, measure_preprocess_throughput, preprocess

    with tempfile.TemporaryDirectory() as tmp:
        if input_spec is None or tokenizer is None:
            input_spec, tokenizer = _bundled_corpus(Path(tmp))
        prefix = str(Path(tmp) / "bench_train")
        preprocess(input_spec, tokenizer, prefix, PreprocessOptions(progress=False, workers=workers))
        pre = measure_preprocess_throughput(input_spec, tokenizer, workers=workers)
        seq = min(setup.seq, 2048)
        loader = {"cold": measure_loader_throughput(prefix, seq_length=seq, micro_batch_size=8, num_batches=100),
                  "warm": measure_loader_throughput(prefix, seq_length=seq, micro_batch_size=8, num_batches=100)}
    rows = [Row("data", "preprocess vs bare tokenizer", {"workers": workers, "input": input_spec}, pre)]
    for label, m in loader.items():
        rows.append(Row("data", f"loader ({label} cache)", {"seq_length": seq, "micro_batch": 8}, m))
    return rows


def _bundled_corpus(root: Path) -> tuple[str, str]:
    """The generated CPU corpus and a BPE tokenizer trained on it (what ``make demo`` uses)."""
    from megatron_loop.data.corpus import CorpusSpec, generate_corpus
    from megatron_loop.data.sources import iter_local_documents
    from megatron_loop.data.tokenizer import train_bpe_tokenizer

    corpus = root / "corpus"
    generate_corpus(corpus, CorpusSpec(seed=3, prose_docs=1500, reasoning_docs_per_task=1000, valid_docs=10,
                                       eval_items_per_depth=2))
    docs = list(iter_local_documents([corpus / "train.jsonl"]))
    tok = train_bpe_tokenizer(docs[:2000], root / "tokenizer", vocab_size=2048)
    return str(corpus / "train.jsonl"), str(tok)


def bench_eval(setup: Setup, family: str, loops_list: list[int], eval_batch: int) -> list[Row]:
    """Forward tokens/s of the HF export (``trust_remote_code``) against the training model."""
    from transformers import AutoModelForCausalLM

    from megatron_loop.hf.convert import export_state_dict

    _, _, (core, loops), _ = FAMILIES[family]
    cfg = model_config(setup, family, core, loops, compile=False)
    model = build(cfg, setup).eval()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        state = {k: v.float().cpu() for k, v in model.state_dict().items() if torch.is_tensor(v)}
        export_state_dict(state, cfg, Path(tmp) / "hf")
        hf = AutoModelForCausalLM.from_pretrained(Path(tmp) / "hf", trust_remote_code=True,
                                                  dtype=setup.dtype).to(setup.device).eval()
    tokens = batch(cfg, setup, eval_batch)
    for r in loops_list:
        with torch.no_grad():
            m = measure({"hf": Case(lambda: hf(tokens, num_loops=r, use_cache=False), tokens.numel(), memory=False),
                         "train": Case(lambda: model(tokens, num_loops=r), tokens.numel(), memory=False)}, setup)
        metrics = {"hf_tokens_per_s": m["hf"]["tokens_per_s"], "train_model_tokens_per_s": m["train"]["tokens_per_s"],
                   **{f"hf_vs_train_{k}": v for k, v in speed_ratios(m["hf"], m["train"]).items()}}
        rows.append(Row("eval", f"{family} {core}x{loops} r={r}", {"r": r, "batch": eval_batch}, metrics))
    del model, hf
    release(setup)
    return rows


def hf_peer(cfg: ModelConfig, setup: Setup) -> torch.nn.Module:
    """HF transformers' own model at our widths with L(K) = p + Ks + c layers (SDPA attention), as a
    user would train the NonLoop reference: Llama (untied) or Qwen3 (QK-norm, tied)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                  num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                  head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_norm_eps,
                  rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_position_embeddings,
                  num_hidden_layers=cfg.effective_depth(), tie_word_embeddings=cfg.tie_word_embeddings,
                  attn_implementation="sdpa", use_cache=False)
    if cfg.qk_norm:
        hf_cfg, cls = Qwen3Config(**common), Qwen3ForCausalLM
    else:
        hf_cfg, cls = LlamaConfig(**common, rope_scaling=cfg.rope_scaling), LlamaForCausalLM
    torch.manual_seed(0)
    return cls(hf_cfg).to(device=setup.device, dtype=setup.dtype).train()


def bench_peers(setup: Setup, families: list[str]) -> list[Row]:
    """Forward + backward of our loop model vs HF's model of the same effective depth, interleaved;
    with ``--compile`` also ``model.compile=true`` vs ``torch.compile(hf_model)``."""
    rows = []
    for family in families:
        _, _, (core, loops), _ = FAMILIES[family]
        cases, flops = {}, None
        for compiled in (False, True) if setup.compile else (False,):
            tag = "compiled" if compiled else "eager"
            cfg = model_config(setup, family, core, loops, compile=compiled)
            ours = build(cfg, setup)
            tokens = batch(cfg, setup)
            flops = train_flops_per_token(cfg, setup.seq)
            hf = hf_peer(cfg, setup)
            if compiled:
                hf = torch.compile(hf)

            def hf_step(hf=hf, tokens=tokens):
                hf(input_ids=tokens, labels=tokens).loss.backward()
                hf.zero_grad(set_to_none=True)

            cases[f"{family} {core}x{loops} ours {tag}"] = Case(train_step(ours, None, tokens), tokens.numel(), flops,
                                                             check_syncs=not compiled)
            cases[f"{family} {cfg.effective_depth()}L HF {tag}"] = Case(hf_step, tokens.numel(), flops)
        measured = measure(cases, setup)
        names = list(measured)
        for name, metrics in measured.items():
            rows.append(Row("peers", name, {}, metrics))
        for i in range(0, len(names), 2):
            ratios = speed_ratios(measured[names[i]], measured[names[i + 1]])
            rows.append(Row("peers", f"ratio {names[i]} / {names[i + 1]}", {}, {**ratios, "target": ">= 1.10"}))
        if setup.compile:  # the comparison the target names: our compiled step vs HF + torch.compile
            ratios = speed_ratios(measured[names[2]], measured[names[3]])
            rows.append(Row("peers", f"ratio {names[2]} / {names[3]}", {}, {**ratios, "target": ">= 1.10"}))
            rows.pop(-2)  # already listed
        del cases
        release(setup)
    return rows


def bench_loss(setup: Setup, families: list[str]) -> list[Row]:
    """The LM head + cross-entropy alone (forward + backward) at the micro-batch's tokens: the
    chunked torch reference vs Liger's fused kernel (CUDA only), interleaved."""
    from megatron_loop.perf import DEFAULT_CHUNK_TOKENS, chunked_linear_cross_entropy

    rows = []
    for family in families:
        _, _, (core, loops), _ = FAMILIES[family]
        cfg = model_config(setup, family, core, loops)
        n = setup.micro_batch * setup.seq
        g = torch.Generator(device="cpu").manual_seed(0)
        hidden = torch.randn(n, cfg.hidden_size, generator=g).to(setup.device, setup.dtype).requires_grad_(True)
        weight = (0.02 * torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)).to(setup.device, setup.dtype)
        weight.requires_grad_(True)
        targets = torch.randint(0, cfg.vocab_size, (n,), generator=g).to(setup.device)

        def step(impl):
            def run():
                chunked_linear_cross_entropy(hidden, weight, targets, DEFAULT_CHUNK_TOKENS,
                                             implementation=impl).backward()
                hidden.grad = weight.grad = None
            return run

        impls = ("chunked", "fused") if setup.cuda else ("chunked",)  # Triton needs CUDA
        flops = 6 * cfg.hidden_size * cfg.vocab_size  # three head matmuls per token
        measured = measure({impl: Case(step(impl), n, flops, check_syncs=True) for impl in impls}, setup)
        for impl, m in measured.items():
            rows.append(Row("loss", f"{family} head+CE {impl}", {"tokens": n, "vocab": cfg.vocab_size}, m))
        if len(impls) == 2:
            rows.append(Row("loss", f"ratio {family} fused / chunked", {},
                            speed_ratios(measured["fused"], measured["chunked"])))
    return rows


def _synthetic_prefix(root: Path, vocab: int, tokens: int) -> str:
    """Random-token documents (ids below ``vocab``) in megatron-core's indexed format."""
    import numpy as np

    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = str(root / "synthetic")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(max(1, tokens // 1000)):
        builder.add_document(torch.from_numpy(rng.integers(0, vocab, 1000, dtype=np.int32)), [1000])
    builder.finalize(prefix + ".idx")
    return prefix


def bench_train(setup: Setup, config: str, data_prefix: str | None, micro_batch: int | None, accumulation: int,
                overrides: list[str]) -> list[Row]:
    """``pretrain_loop.py --config CONFIG`` for ``--warmup + --steps`` steps: the DeepSpeed engine
    of ``build_engine``, the config's checkpointing, compile and micro-batch (unless overridden),
    one rank, global batch = micro-batch x ``--accumulation``. CPU shrinks the widths and the
    sequence as the other modes do. Reports the medians of what metrics.jsonl logs."""
    from megatron_loop.config import load_config
    from megatron_loop.training.loop import train

    with tempfile.TemporaryDirectory() as tmp:
        base = load_config(config)
        micro = micro_batch or base.train.micro_batch_size
        sets = [f"train.seq_length={setup.seq}", f"train.micro_batch_size={micro}",
                f"train.global_batch_size={micro * accumulation}", f"train.max_steps={setup.steps + setup.warmup}",
                "train.train_tokens=null", f"train.output_dir={tmp}/run", "train.save_interval=1000000",
                "train.eval_interval=0", "train.resume=false", "logging.wandb_project=null",
                "logging.progress_bar=false", "data.valid_prefixes=[]", "data.tokenizer=null"]
        if not setup.cuda:
            sets += [f"model.{k}={v}" for k, v in CPU_WIDTHS.items()] + ["model.rope_scaling=null"]
        cfg = load_config(config, overrides=sets + list(overrides))
        prefix = data_prefix or _synthetic_prefix(Path(tmp), cfg.model.vocab_size,
                                                  (setup.steps + setup.warmup + 2) * micro * accumulation
                                                  * (setup.seq + 1))
        cfg = load_config(config, overrides=sets + list(overrides) + [f"data.train_prefixes=[{prefix}]"])
        code = train(cfg)
        records = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    metrics = train_summary(records, setup.warmup)
    measured = metrics.pop("steps_measured")
    metrics["exit_code"] = code
    params = {"config": config, "micro_batch": micro, "accumulation": accumulation,
              "activation_checkpointing": cfg.model.activation_checkpointing, "compile": cfg.model.compile_enabled,
              "loss_implementation": cfg.model.loss_implementation, "steps_measured": measured}
    return [Row("train", f"{Path(config).stem} ({measured} steps, median)", params, metrics)]


def bench_profile(setup: Setup, config: str, top: int) -> list[Row]:
    """Where one forward + backward of ``--config``'s model (its checkpointing, compile setting of
    ``--compile``) spends its time: torch.profiler, ops by self time (CUDA kernels on GPU)."""
    from torch.profiler import ProfilerActivity, profile

    from megatron_loop.config import load_config

    values = dict(vars(load_config(config).model), compile=setup.compile)
    if not setup.cuda:
        values.update(CPU_WIDTHS, rope_scaling=None)
    cfg = build_model_config({k: v for k, v in values.items() if k != "backbone"})
    model = build(cfg, setup)
    tokens = batch(cfg, setup)
    step = train_step(model, None, tokens)
    for _ in range(max(1, setup.warmup)):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.cuda else [])
    with profile(activities=activities) as prof:
        step()
        synchronize_device = torch.cuda.synchronize if setup.cuda else (lambda: None)
        synchronize_device()
    attr = "self_device_time_total" if setup.cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr) > 0]
    total = sum(getattr(e, attr) for e in events)
    rows = []
    for e in sorted(events, key=lambda e: getattr(e, attr), reverse=True)[:top]:
        rows.append(Row("profile", e.key, {}, {"self_ms": getattr(e, attr) / 1e3, "share": getattr(e, attr) / total,
                                              "calls": e.count}))
    rows.append(Row("profile", "total (one step)", {"config": config}, {"self_ms": total / 1e3, "share": 1.0}))
    return rows


def bench_backprop(setup: Setup, family: str, loops: int) -> list[Row]:
    """Forward + backward at K loops with ``backprop_loops`` N = 1, K/2, K and full (None), one model
    (channel initial injection, checkpointing off), side by side; FLOPs count the executed backward."""
    core = FAMILIES[family][2][0]
    cfg = model_config(setup, family, core, loops, initial_injection="channel")
    model, tokens = build(cfg, setup), batch(cfg, setup)

    def step(n: int | None) -> Callable[[], None]:
        def run() -> None:
            model(tokens, labels=tokens, compute_logits=False, backprop_loops=n).loss.backward()
            model.zero_grad(set_to_none=True)
        return run

    windows = {"full": None, f"N={loops} (K)": loops, f"N={loops // 2} (K/2)": loops // 2, "N=1": 1}
    measured = measure({name: Case(step(n), tokens.numel(), train_flops_per_token(cfg, setup.seq, None, n))
                        for name, n in windows.items()}, setup)
    rows = []
    for name, m in measured.items():
        m.update(time_vs_full=m["step_s"] / measured["full"]["step_s"],
                 peak_vs_full=m["peak_step_mib"] / measured["full"]["peak_step_mib"],
                 paired_speedup_vs_full=speed_ratios(m, measured["full"])["ratio_paired"])  # t_full / t
        rows.append(Row("backprop", f"{family} {core}x{loops} {name}", {"K": loops, "backprop_loops": windows[name]}, m))
    release(setup)
    return rows


def bench_exit_decode(setup: Setup, model_dir: str, valid_prefix: str, fixed: list[int], exits: list[str],
                      prompts: int = 8, prompt_tokens: int = 32, new_tokens: int = 32) -> list[Row]:
    """Greedy ``generate`` (KV cache, batch 1) of an HF export on held-out prompts: tokens/s at each
    fixed r and under each ``criterion:threshold`` adaptive exit (cap: the largest fixed r), timed
    interleaved; mean loops per decoded token, and the share of decoded tokens equal to fixed r = cap."""
    from transformers import AutoModelForCausalLM

    from megatron_loop.data.packed import PackedDataset

    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True).to(setup.device).eval()
    data = PackedDataset(valid_prefix, seq_length=prompt_tokens, seed=1234)
    inputs = [data[i]["tokens"][None].to(setup.device) for i in range(min(prompts, len(data)))]
    cap = max(fixed)
    settings = {f"fixed r={r}": dict(num_loops=r) for r in fixed}
    for spec in exits:
        criterion, threshold = spec.split(":")
        settings[f"{criterion} exit {threshold}, r<={cap}"] = dict(num_loops=cap, exit_criterion=criterion,
                                                                  exit_threshold=float(threshold))
    outputs, loops = {}, {}

    def decode(name: str, fields: dict) -> Callable[[], None]:
        def run() -> None:  # on the config: generate sizes the KV cache from config.num_loops
            for key, value in {**defaults, **fields}.items():
                setattr(model.config, key, value)
            with torch.no_grad():
                outputs[name] = [model.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                                do_sample=False, pad_token_id=0, eos_token_id=None)
                                 for x in inputs]
        return run

    defaults = dict(num_loops=None, exit_criterion="none", exit_threshold=0.0)

    def count(module, args, kwargs, output) -> None:  # decode steps only (one new token per forward)
        if output.exit_loops is not None and output.exit_loops.shape[1] == 1:
            loops.setdefault(counting[0], []).append(float(output.exit_loops.float().mean()))

    counting = [""]
    measured = measure({name: Case(decode(name, kw), len(inputs) * new_tokens, memory=False)
                        for name, kw in settings.items()}, setup)
    handle = model.register_forward_hook(count, with_kwargs=True)
    for name, kw in settings.items():
        counting[0] = name
        decode(name, kw)()
    handle.remove()
    reference = torch.cat([o[0, prompt_tokens:] for o in outputs[f"fixed r={cap}"]])
    rows = []
    for name, m in measured.items():
        got = torch.cat([o[0, prompt_tokens:] for o in outputs[name]])
        m.update(loops_per_token=statistics.mean(loops[name]) if name in loops else settings[name]["num_loops"],
                 same_tokens_as_cap=float((got == reference).float().mean()),
                 speedup_vs_cap=speed_ratios(m, measured[f"fixed r={cap}"])["ratio_paired"])  # t_cap / t
        rows.append(Row("exit-decode", name, {"prompts": len(inputs), "new_tokens": new_tokens}, m))
    return rows


# ----------------------------------------------------------------------------- output


def render(rows: list[Row]) -> str:
    """A markdown table per mode: case, then every metric the mode's rows carry."""
    out = []
    for mode in dict.fromkeys(r.mode for r in rows):
        out += [f"\n### {mode}\n", *markdown_table([(r.case, r.metrics) for r in rows if r.mode == mode])]
    return "\n".join(out)


def provenance(setup: Setup, argv: list[str]) -> dict:
    device = torch.cuda.get_device_name(setup.device) if setup.cuda else cpu_name()
    return {"command": "python tools/bench.py " + " ".join(argv),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": git_commit(),
            "device": device, "torch": torch.__version__, "dtype": str(setup.dtype).replace("torch.", ""),
            "seq": setup.seq, "micro_batch": setup.micro_batch, "steps": setup.steps, "warmup": setup.warmup,
            "compile": setup.compile, "engine": setup.engine, "peak_flops": setup.peak_flops,
            "peak": setup.peak_label}


# ----------------------------------------------------------------------------- CLI


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
    ap.add_argument("--accumulation", type=int, default=None,
                    help="micro-batches of the measured accumulated step (default 6 cuda, 4 cpu)")
    ap.add_argument("--data-input", default=None, help="documents for the data mode (default: generated corpus)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer for --data-input (default: one trained on it)")
    ap.add_argument("--workers", type=int, default=1, help="preprocessing workers for the data mode")
    ap.add_argument("--config", default="examples/llama_4x5.yaml", help="shipped example for --mode train/profile")
    ap.add_argument("--data-prefix", default=None,
                    help="indexed dataset for --mode train (default: random tokens below the vocabulary)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for --mode train (repeatable), e.g. --set model.compile=true")
    ap.add_argument("--ac-budget-gib", type=float, default=None,
                    help="activation_checkpointing=auto budget in the checkpointing mode (default: midway)")
    ap.add_argument("--ac-modes", default=",".join(AC_MODES),
                    help="activation_checkpointing modes of the checkpointing mode (comma list)")
    ap.add_argument("--ac-reference-micro-batch", type=int, default=None,
                    help="checkpointing mode: run the none case at this micro-batch (one that fits unconstrained); "
                         "time_vs_none is then per token")
    ap.add_argument("--top", type=int, default=12, help="rows of the profile table")
    ap.add_argument("--json", default=None, help="write every figure and its provenance here")
    ap.add_argument("--hf-model", default=None, help="exit-decode: an HF export (tools/convert_to_hf.py)")
    ap.add_argument("--valid-prefix", default=None, help="exit-decode: indexed prefix the prompts come from")
    ap.add_argument("--exits", default="kl:1e-2", help="exit-decode: comma list of criterion:threshold")
    return ap


def fail(message: str) -> None:
    """A bad argument: one ``error:`` line, exit code 2 (docs/ERRORS.md)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def make_setup(args: argparse.Namespace) -> Setup:
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        fail("--device cuda: no CUDA device visible")
    device = torch.device("cuda" if cuda else "cpu")
    if args.engine == "deepspeed" or "train" in args.mode.split(","):
        from megatron_loop.optim import init_distributed

        init_distributed()  # before any model: DeepSpeed needs the process group it initialises itself
    if not cuda:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        peak, label = H100_BF16_PEAK_FLOPS, "989 TFLOP/s (H100/H200 dense bf16)"
    else:
        peak = matmul_peak_flops(device, dtype)
        label = f"measured fp32 1024^3 matmul, {args.threads} thread(s): {peak / 1e9:.1f} GFLOP/s"
    return Setup(device=device, dtype=dtype, seq=args.seq or (2048 if cuda else 128),
                 micro_batch=args.micro_batch or (8 if cuda else 4), steps=args.steps or (10 if cuda else 9),
                 warmup=args.warmup if args.warmup is not None else (3 if cuda else 1), compile=args.compile,
                 peak_flops=peak, peak_label=label, engine=args.engine)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    # "all": every side-by-side mode in this process (train starts its own engine: run it alone;
    # exit-decode needs a trained export, --hf-model)
    modes = tuple(m for m in MODES if m not in ("train", "exit-decode")) if args.mode == "all" else tuple(
        m.strip() for m in args.mode.split(","))
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        fail(f"--mode {unknown[0]!r}: expected one of {', '.join(MODES)} or 'all'")
    setup = make_setup(args)
    families = (args.families.split(",") if args.families else (["llama", "qwen"] if setup.cuda else ["llama"]))
    loops = [int(k) for k in (args.loops or ("5,10" if setup.cuda else "2,4,8")).split(",")]
    if "recompute" in modes and loops[-1] < 2:
        fail(f"--mode recompute: expected --loops K >= 2 (K - 1 loops are recomputed), got {loops[-1]}")
    if args.ac_reference_micro_batch is not None and args.ac_reference_micro_batch < 1:
        fail(f"--ac-reference-micro-batch {args.ac_reference_micro_batch}: expected a positive integer")
    rows: list[Row] = []
    for mode in modes:
        start = time.perf_counter()
        if mode == "loop-vs-nonloop":
            rows += bench_loop_vs_nonloop(setup, families)
        elif mode == "checkpointing":
            rows += bench_checkpointing(setup, families[0], loops, args.ac_budget_gib,
                                        tuple(args.ac_modes.split(",")), args.ac_reference_micro_batch)
        elif mode == "recompute":
            rows += bench_recompute(setup, families[0], loops[-1])
        elif mode == "peers":
            rows += bench_peers(setup, families)
        elif mode == "train":
            rows += bench_train(setup, args.config, args.data_prefix, args.micro_batch, args.accumulation or 1,
                                args.set)
        elif mode == "loss":
            rows += bench_loss(setup, families)
        elif mode == "profile":
            rows += bench_profile(setup, args.config, args.top)
        elif mode == "optimizer":
            rows += bench_optimizer(setup, families[0], args.accumulation or (6 if setup.cuda else 4))
        elif mode == "data":
            rows += bench_data(setup, args.data_input, args.tokenizer, args.workers)
        elif mode == "compile":
            rows += bench_compile(setup, families[0])
        elif mode == "eval":
            rows += bench_eval(setup, families[0], [int(r) for r in args.eval_loops.split(",")],
                               eval_batch=setup.micro_batch)
        elif mode == "backprop":
            rows += bench_backprop(setup, families[0], loops[-1])
        elif mode == "exit-decode":
            if not (args.hf_model and args.valid_prefix):
                fail("--mode exit-decode: expected --hf-model DIR and --valid-prefix P")
            rows += bench_exit_decode(setup, args.hf_model, args.valid_prefix,
                                      [int(r) for r in args.eval_loops.split(",")], args.exits.split(","))
        print(f"[bench] {mode}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    info = provenance(setup, argv)
    print(f"device {info['device']} | {info['dtype']} | seq {setup.seq} | micro-batch {setup.micro_batch} | "
          f"steps {setup.steps} (+{setup.warmup} warm-up) | commit {info['commit']} | {info['date']} | "
          f"MFU peak: {setup.peak_label}")
    print(render(rows))
    if args.json:
        write_atomic(args.json, json.dumps({"provenance": info, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
