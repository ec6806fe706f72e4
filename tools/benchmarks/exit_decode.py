"""``--mode exit-decode``: greedy decode tokens/s of an HF export, fixed r against per-token
adaptive exit."""

from __future__ import annotations

import argparse
import statistics
from typing import Callable

import torch
from transformers import AutoModelForCausalLM

from megatron_loop.data.packed import PackedDataset

from .harness import Case, Row, Setup, measure, speed_ratios

UNSET_EXIT = dict(num_loops=None, exit_criterion="none", exit_threshold=0.0)  # the export's own settings


def bench_exit_decode(setup: Setup, model_dir: str, valid_prefix: str, fixed: list[int], exits: list[str],
                      prompts: int = 8, prompt_tokens: int = 32, new_tokens: int = 32) -> list[Row]:
    """Greedy ``generate`` (KV cache, batch 1) of an HF export on held-out prompts: tokens/s at each
    fixed r and under each ``criterion:threshold`` adaptive exit (cap: the largest fixed r), timed
    interleaved; mean loops per decoded token, and the share of decoded tokens equal to fixed r = cap."""
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
            for key, value in {**UNSET_EXIT, **fields}.items():
                setattr(model.config, key, value)
            with torch.no_grad():
                outputs[name] = [model.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                                do_sample=False, pad_token_id=0, eos_token_id=None)
                                 for x in inputs]
        return run

    def count(module, args, kwargs, output) -> None:  # decode steps only (one new token per forward)
        if output.exit_loops is not None and output.exit_loops.shape[1] == 1:
            loops.setdefault(counting[0], []).append(float(output.exit_loops.float().mean()))

    counting = [""]
    measured = measure({name: Case(decode(name, kw), len(inputs) * new_tokens, memory=False)
                        for name, kw in settings.items()}, setup)
    handle = model.register_forward_hook(count, with_kwargs=True)
    for name, kw in settings.items():  # once more, untimed, counting the loops each decoded token ran
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


def run(setup: Setup, args: argparse.Namespace) -> list[Row]:
    return bench_exit_decode(setup, args.hf_model, args.valid_prefix, args.eval_loops, args.exits.split(","))
