"""``--mode peers``: our step against HF transformers' LlamaForCausalLM / Qwen3ForCausalLM at the same
widths, depth (p + Ks + c layers) and micro-batch, eager (and torch.compile'd with ``--compile``).

Cases per family: our LoopLM at the family's paper shape (Llama 4x5, Qwen 4x7) and, on CPU, also its
NonLoop twin of the same effective depth (20x1, 28x1), each against HF's model of that depth, plus our
model built from megatron-core's own block modules (``fast_path=False``, eager: the path before the
block's fast path, ``megatron_loop/model/fast_path.py``). Ratio rows: ours / HF, megatron-core / HF
and ours / megatron-core, each as the ratio of medians, of best steps and *paired* (per round, the
other case's step time over this one's) with its interquartile range over the rounds.

Timing: every case of a family runs once per round, in an order shuffled each round (a fixed seed),
so that no case always follows the same other one (the one before leaves the caches in its state).
On CPU a step is timed in process CPU time (``time.process_time``: descheduling on the shared
machine does not count) and glibc's heap is pinned for the mode (no trimming, no mmap of blocks
under 32 MiB): otherwise freed heap tops go back to the OS and are page-faulted in again the next
step, in amounts that depend on each model's allocation order (seen: 0 to 3,000 minor faults per
step for the same model in different processes, up to 5 % of a step). Minor faults per step are
reported. On CUDA: wall clock, the device synchronised at step boundaries.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import resource
import statistics
import time
from typing import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from megatron_loop.config import ModelConfig
from megatron_loop.model import build_model
from megatron_loop.parallel.parallelize import parallelize

from .harness import (Case, ModelFlops, Row, Setup, count_host_syncs, mfu, paired_ratios, peak_memory_delta,
                      release)
from .models import FAMILIES, build, loop_shape, model_config, train_step
from .synthetic import random_tokens

TARGET = ">= 1.10"  # GPU: our compiled step / HF + torch.compile
CPU_TARGET = ">= 0.97 paired"  # CPU, eager: the block's fast path at HF's speed (docs/BENCHMARKS.md)
SEED = 0  # of the per-round case order


def hf_peer(cfg: ModelConfig, setup: Setup) -> torch.nn.Module:
    """HF transformers' own model at our widths with L(K) = p + Ks + c layers (SDPA attention), as a
    user would train the NonLoop reference: Llama (untied) or Qwen3 (QK-norm, tied)."""
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


def megatron_core_model(cfg: ModelConfig, setup: Setup) -> torch.nn.Module:
    """Our model with blocks of megatron-core's own modules (``fast_path=False``), built as
    ``models.build`` builds ours: the same seed, so the same weights. megatron-core's attention reads its
    process groups when it runs: a world of one is made for it (``ensure_groups``)."""
    from megatron_loop.parallel.bootstrap import ensure_groups

    ensure_groups()
    torch.manual_seed(0)
    model = build_model(cfg, fast_path=False).to(device=setup.device, dtype=setup.dtype).train()
    parallelize(model, zero_stage=0)
    return model


def pin_glibc_heap() -> bool:
    """glibc: never trim the heap, never mmap blocks under 32 MiB (see the module docstring).
    Returns whether it applied (False off glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt(int param, int value) (malloc.h)
    mmap = libc.mallopt(ctypes.c_int(m_mmap_threshold), ctypes.c_int(32 * 2**20))  # glibc's largest allowed
    trim = libc.mallopt(ctypes.c_int(m_trim_threshold), ctypes.c_int(2**31 - 1))
    return bool(mmap) and bool(trim)


def time_shuffled(steps: dict[str, Callable[[], None]],
                  setup: Setup) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Seconds of ``setup.steps`` rounds of every step (after ``setup.warmup`` untimed rounds), the
    order shuffled each round; CPU: process CPU time and the minor page faults of each step."""
    cuda = setup.device.type == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    order = random.Random(SEED)
    names = list(steps)
    for _ in range(setup.warmup):
        for name in names:
            steps[name]()
    times = {name: [] for name in names}
    faults = {name: [] for name in names}
    for _ in range(setup.steps):
        order.shuffle(names)
        for name in names:
            if cuda:
                torch.cuda.synchronize(setup.device)
            minflt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = clock()
            steps[name]()
            if cuda:
                torch.cuda.synchronize(setup.device)
            times[name].append(clock() - start)
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - minflt)
    return times, faults


def measure_shuffled(cases: dict[str, Case], setup: Setup) -> dict[str, dict]:
    """``harness.measure`` with :func:`time_shuffled` as its timing: median and best step, tokens/s,
    TFLOP/s and MFU, the step's peak memory, host syncs where asked, minor faults per step."""
    times, faults = time_shuffled({name: c.step for name, c in cases.items()}, setup)
    out = {}
    for name, case in cases.items():
        median = statistics.median(times[name])
        m = {"step_s": median, "step_s_min": min(times[name]), "tokens_per_s": case.tokens / median,
             "_step_times": times[name]}
        if not setup.cuda:
            m["minor_faults_per_step"] = statistics.median(faults[name])
        if case.flops is not None:
            f = case.flops
            utilisation = mfu(m["tokens_per_s"], f.cfg, f.seq_length, setup.peak_flops, f.num_loops, f.backprop_loops)
            m["tflops"] = utilisation * setup.peak_flops / 1e12
            m["mfu" if setup.cuda else "mfu_vs_matmul"] = utilisation
        if case.memory:
            m["peak_step_mib"] = peak_memory_delta(case.step, setup.device) / 2**20
        if case.check_syncs:
            where: list[str] = []
            m["host_syncs"] = count_host_syncs(case.step, setup.device, where)
            if where:
                m["host_sync_sites"] = sorted(set(where))
        out[name] = m
    return out


def shapes(family: str, setup: Setup) -> list[tuple[int, int]]:
    """(core layers, loops) to compare: the paper's loop shape; on CPU also its NonLoop twin."""
    loop = loop_shape(family)
    return [loop] if setup.cuda else [loop, FAMILIES[family][3]]


def bench_family(setup: Setup, family: str) -> list[Row]:
    """Every case of one family measured together: per mode (eager; compiled with ``--compile``) HF's
    model and ours at each shape of that depth, eager also megatron-core's block modules."""
    cases, pairs = {}, []
    for compiled in (False, True) if setup.compile else (False,):
        tag = "compiled" if compiled else "eager"
        peer = None
        for core, loops in shapes(family, setup):
            cfg = model_config(setup, family, core, loops, compile=compiled)
            tokens = random_tokens(cfg, setup)
            flops = ModelFlops(cfg, setup.seq)  # HF's model at depth L(K) does the same matmuls
            if peer is None:  # one HF model per mode: every shape has its depth L(K)
                hf = hf_peer(cfg, setup)
                if compiled:
                    hf = torch.compile(hf)

                def hf_step(hf=hf, tokens=tokens):
                    hf(input_ids=tokens, labels=tokens).loss.backward()
                    hf.zero_grad(set_to_none=True)

                peer = f"{family} {cfg.effective_depth()}L HF {tag}"
                cases[peer] = Case(hf_step, tokens.numel(), flops)
            ours = f"{family} {core}x{loops} ours {tag}"
            cases[ours] = Case(train_step(build(cfg, setup), None, tokens), tokens.numel(), flops,
                               check_syncs=not compiled)
            pairs.append((ours, peer))
            if not compiled:
                reference = f"{family} {core}x{loops} megatron-core {tag}"
                cases[reference] = Case(train_step(megatron_core_model(cfg, setup), None, tokens), tokens.numel(),
                                        flops)
                pairs += [(reference, peer), (ours, reference)]
    measured = measure_shuffled(cases, setup)
    rows = [Row("peers", name, {}, metrics) for name, metrics in measured.items()]
    for a, b in pairs:
        target = {"target": TARGET if setup.cuda else CPU_TARGET} if " ours " in a and " HF " in b else {}
        rows.append(Row("peers", f"ratio {a} / {b}", {}, {**paired_ratios(measured[a], measured[b]), **target}))
    return rows


def bench_peers(setup: Setup, families: list[str]) -> list[Row]:
    """Forward + backward of our model vs HF's model of the same effective depth (and vs our model on
    megatron-core's own block modules), timed shuffled and paired."""
    if not setup.cuda:
        pin_glibc_heap()
    rows = []
    for family in families:
        rows += bench_family(setup, family)
        release(setup)
    return rows


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_peers(setup, args.families)
