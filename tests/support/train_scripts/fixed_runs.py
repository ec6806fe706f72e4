"""The fixed runs of a behaviour-preserving refactor: train a few tiny configurations and record every
logged number bitwise.

    python tests/support/train_scripts/fixed_runs.py OUT.json [--only NAME ...] [--compare BASE.json]

Each run is ``pretrain_loop.py`` on a few steps of a synthetic indexed corpus written here (random token
ids from a fixed seed through megatron-core's ``IndexedDatasetBuilder``, so nothing depends on the
project's corpus generator or tokenizer). Every ``train`` record's loss and gradient norm and every
``eval`` record's validation losses and every number of the loop dynamics are written as ``float.hex`` strings, per run, to ``OUT.json``;
``--compare BASE.json`` then exits 1 naming each number that differs (0 when all are bitwise equal).

The runs (the four of the earlier refactors, then one per design whose training step differs):

* ``hist_lg_resume``: history-state injection + Loop Gating, stopped at step 3 (``train.exit_interval``)
  and resumed to step 6 (the resumed segment must equal the uninterrupted numbers' continuation);
* ``coreloop_dense_adaln_per_loop``: a CoreLoop 1+2x3+1 with dense initial injection and AdaLN,
  per-loop activation recomputation;
* ``zero3_bf16``: ZeRO-3 in bf16 on 2 gloo ranks (torchrun);
* ``tp2_sp``: tensor parallelism 2 with sequence parallelism (torchrun, ZeRO 1);
* ``huginn_noise``: Huginn's sandwich blocks and noise initial state (the per-step seed);
* ``loopformer_shortcut``: LoopFormer's shortcut modulation and shortcut-consistency objective;
* ``ouro_stage1``: Ouro's learned exit gate, Stage I objective;
* ``sampled_truncated``: sampled loop counts with truncated backpropagation.

The runs of ``EXPORTS`` are also exported (``tools/convert_to_hf.py``) and read back with transformers
(``trust_remote_code``): losses at several r, with adaptive exit, the one-pass readouts and a few greedy
tokens with the KV cache, recorded the same way.

CPU only, about a minute per run on a loaded 2-core machine. Run it with the checkout first on
``PYTHONPATH`` (the runs are subprocesses that inherit it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[3]
VOCAB = 640


def write_corpus(prefix: Path, documents: int, seed: int) -> None:
    """Random documents of 20-160 token ids below ``VOCAB`` (id 0 ends each: the EOS of the packer)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    for _ in range(documents):
        ids = rng.integers(1, VOCAB, size=int(rng.integers(20, 160)))
        builder.add_document(torch.from_numpy(np.append(ids, 0).astype(np.int64)), [len(ids) + 1])
    builder.finalize(str(prefix) + ".idx")


def base_config(out: Path, prefix: Path) -> dict:
    return {
        "model": {"backbone": "tiny-llama", "core_layers": 2, "train_loops": 3, "vocab_size": VOCAB,
                  "activation_checkpointing": "none"},
        "train": {"seq_length": 32, "global_batch_size": 8, "micro_batch_size": 2, "lr": 3e-3, "max_steps": 4,
                  "precision": "fp32", "deepspeed_config": "deepspeed_configs/zero1.json", "output_dir": str(out),
                  "save_interval": 100, "log_interval": 1, "eval_interval": 2, "eval_batches": 2},
        "data": {"train_prefixes": [str(prefix)], "num_workers": 0},
        "logging": {"progress_bar": False, "dynamics_interval": 2},
    }


def merge(cfg: dict, **sections) -> dict:
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


# name -> (ranks, launches: the sections each launch sets over the base config)
RUNS: dict[str, tuple[int, list[dict]]] = {
    "hist_lg_resume": (1, [
        dict(model={"history_injection": "channel", "history_window": 2, "timestep": "loop_gating"},
             train={"max_steps": 6, "save_interval": 3, "exit_interval": 3}),
        dict(model={"history_injection": "channel", "history_window": 2, "timestep": "loop_gating"},
             train={"max_steps": 6, "save_interval": 3}),
    ]),
    "coreloop_dense_adaln_per_loop": (1, [
        dict(model={"prelude_layers": 1, "coda_layers": 1, "initial_injection": "dense", "timestep": "adaln",
                    "activation_checkpointing": "per_loop"}),
    ]),
    "zero3_bf16": (2, [dict(train={"precision": "bf16", "deepspeed_config": "deepspeed_configs/zero3.json"})]),
    "tp2_sp": (2, [dict(parallel={"tensor_model_parallel_size": 2, "sequence_parallel": True})]),
    "huginn_noise": (1, [
        dict(model={"prelude_layers": 1, "coda_layers": 1, "initial_injection": "dense", "block_norm": "sandwich",
                    "norm_core_output": True, "initial_state": "noise"}),
    ]),
    "loopformer_shortcut": (1, [
        dict(model={"timestep": "shortcut"}, train={"shortcut_consistency": True}),
    ]),
    "ouro_stage1": (1, [
        dict(model={"exit_gate": "learned"}, train={"exit_gate_objective": "entropy_regularized"}),
    ]),
    "sampled_truncated": (1, [
        dict(model={"timestep": "branch_gating", "initial_injection": "scalar"},
             train={"loop_sampling": "uniform", "loop_sampling_min": 1, "loop_sampling_max": 4,
                    "backprop_loops": 2}),
    ]),
}


def launch(config: Path, ranks: int, log: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", HF_HUB_OFFLINE="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if ranks == 1:
        cmd = [sys.executable, str(REPO / "pretrain_loop.py"), "--config", str(config)]
    else:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", str(ranks), "--master_port",
               str(port), str(REPO / "pretrain_loop.py"), "--config", str(config)]
    with open(log, "a") as f:
        done = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=1200)
    if done.returncode != 0:
        sys.exit(f"{config}: exit code {done.returncode}; log {log}:\n" + log.read_text()[-3000:])


def numbers(metrics: Path) -> list[str]:
    """"EVENT STEP KEY HEX" for every loss and gradient norm of a step, every validation loss and every
    number of the loop dynamics (per-loop norms and updates, losses at K - 1, K, K + 1, gates)."""
    rows = []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        event = record.get("event")
        if event == "train":
            keys = ["loss", "grad_norm"]
        elif event == "eval":
            keys = sorted(k for k in record if k.startswith("val_loss"))
        elif event == "dynamics":
            keys = sorted(k for k, v in record.items() if k not in ("event", "step") and v is not None)
        else:
            continue
        for key in keys:
            values = record[key] if isinstance(record[key], list) else [record[key]]
            rows.append(f"{event} {record['step']} {key} " + " ".join(float(v).hex() for v in values))
    return rows


# runs whose checkpoint is also exported (tools/convert_to_hf.py) and read back with transformers alone;
# name -> the per-call options of each recorded forward besides the loop count
EXPORTS = {
    "hist_lg_resume": [{}, {"exit_criterion": "cosine", "exit_threshold": 1e-3}],
    "coreloop_dense_adaln_per_loop": [{}],
    "huginn_noise": [{}],
    "loopformer_shortcut": [{}],
    "ouro_stage1": [{}, {"exit_criterion": "q_exit", "exit_threshold": 0.5}],
}


def export_numbers(name: str, run: Path, work: Path, prefix: Path) -> list[str]:
    """The export of ``run``'s last checkpoint read with ``trust_remote_code``: the loss of a fixed batch at
    r = 1, 3, 5 (with each of ``EXPORTS[name]``'s options), the one-pass readouts where the export allows
    them, and 6 greedily generated tokens (KV cache) at r = 3."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    out = work / f"{name}.hf"
    done = subprocess.run([sys.executable, str(REPO / "tools" / "convert_to_hf.py"), "--checkpoint",
                           str(run / "checkpoints"), "--output", str(out)], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name}: export failed:\n{done.stderr[-3000:]}")
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    data = IndexedDataset(str(prefix) + "_valid")
    tokens = torch.tensor(np.concatenate([data[i] for i in range(6)])[:96].astype(np.int64)).view(2, 48)
    rows = []
    with torch.no_grad():
        for options in EXPORTS[name]:
            tag = ",".join(f"{k}={v}" for k, v in options.items()) or "plain"
            for r in (1, 3, 5):
                out_r = model(tokens, labels=tokens, num_loops=r, **options)
                rows.append(f"export {tag} r{r} loss {float(out_r.loss).hex()}")
        if model.readout_obstacle([1, 3, 5]) is None:
            for r, logits in model.loop_readouts(tokens, [1, 3, 5]).items():
                rows.append(f"export readout r{r} logit_sum {float(logits.double().sum()).hex()}")
        model.config.num_loops = 3
        generated = model.generate(tokens[:1, :16], max_new_tokens=6, do_sample=False)
        rows.append("export generate r3 " + " ".join(str(int(t)) for t in generated[0, 16:]))
    return rows


def run_all(names: list[str], work: Path) -> dict:
    prefix = work / "data" / "train"
    prefix.parent.mkdir(parents=True)
    write_corpus(prefix, 400, seed=1234)
    write_corpus(Path(str(prefix) + "_valid"), 40, seed=4321)
    results = {}
    for name in names:
        ranks, launches = RUNS[name]
        out = work / name
        for i, sections in enumerate(launches):
            config = work / f"{name}.{i}.yaml"
            config.write_text(yaml.safe_dump(merge(base_config(out, prefix), **json.loads(json.dumps(sections)))))
            launch(config, ranks, work / f"{name}.log")
        results[name] = numbers(out / "metrics.jsonl")
        if name in EXPORTS:
            results[name] += export_numbers(name, out, work, prefix)
        print(f"{name}: {len(results[name])} numbers", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), default=None)
    parser.add_argument("--compare", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fixed_runs_"))
    try:
        results = run_all(args.only or list(RUNS), work)
    finally:
        if args.keep:
            print(f"work folder: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    if args.compare is None:
        return 0
    base = json.loads(args.compare.read_text())
    differ = [f"{name}: {a} != {b}" for name in results for a, b in zip(base.get(name, []), results[name]) if a != b]
    differ += [f"{name}: {len(base.get(name, []))} numbers in the base, {len(results[name])} now"
               for name in results if len(base.get(name, [])) != len(results[name])]
    print("\n".join(differ) if differ else f"bitwise equal: {sum(map(len, results.values()))} numbers")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
