"""Shared, once-per-session assets for the HF export and evaluation tests.

Tiny LoopLMs covering BaseLoop, CoreLoop, NonLoop and every conditioning type are trained
for one DeepSpeed step (ZeRO 1 in one process, one model with ZeRO 3 on two gloo ranks),
saved as DeepSpeed checkpoints and exported to HF folders (the ZeRO 3 one through the CLI).
Plain cached functions rather than fixtures, like ``data_fixtures``.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from data_fixtures import REPO, data_assets
from testpaths import HF_SCRIPTS
from megatron_loop.parallel.bootstrap import free_port

VOCAB = 640  # >= the 600-token test tokenizer
LLAMA = {"backbone": "tiny-llama", "vocab_size": VOCAB}
QWEN = {"backbone": "tiny-qwen", "vocab_size": VOCAB}

# name -> (ZeRO stage, model fields). Together: BaseLoop, CoreLoop, NonLoop (both families),
# every initial-injection, history-injection and timestep variant, GQA everywhere (4 heads, 2 groups).
MODELS: dict[str, tuple[int, dict]] = {
    "base_llama": (1, {**LLAMA, "core_layers": 2, "train_loops": 3}),
    "core_qwen_scalar_lg": (1, {**QWEN, "prelude_layers": 1, "core_layers": 1, "coda_layers": 1, "train_loops": 3,
                                "initial_injection": "scalar", "history_injection": "scalar",
                                "history_window": 1, "timestep": "loop_gating"}),
    "base_llama_channel_bg": (1, {**LLAMA, "core_layers": 2, "train_loops": 2, "initial_injection": "channel",
                                  "history_injection": "channel", "history_window": 2,
                                  "timestep": "branch_gating"}),
    "base_qwen_dense": (1, {**QWEN, "core_layers": 1, "train_loops": 3, "initial_injection": "dense",
                            "history_injection": "dense", "history_window": 2, "timestep": "adaln"}),
    "core_llama_rc_adaln_z3": (3, {**LLAMA, "prelude_layers": 1, "core_layers": 2, "train_loops": 2,
                                   "initial_injection": "residual_channel", "history_injection": "dense",
                                   "history_window": 2, "timestep": "adaln"}),
    "nonloop_llama": (1, {**LLAMA, "core_layers": 3, "train_loops": 1}),
    "nonloop_qwen": (1, {**QWEN, "core_layers": 2, "train_loops": 1}),
}
CLI_EXPORTED = "core_llama_rc_adaln_z3"


@dataclass(frozen=True)
class HFAssets:
    root: Path
    tokenizer: Path
    checkpoints: dict  # name -> DeepSpeed save dir
    exports: dict      # name -> HF folder
    cli_output: str    # stdout + stderr of the CLI export


def offline_env(**extra: str) -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                OMP_NUM_THREADS="1", WANDB_MODE="disabled", PYTHONPATH=str(REPO), **extra)


def _spec(root: Path, stage: int) -> Path:
    spec = {name: {"model": fields, "out": str(root / "ckpt" / name)}
            for name, (s, fields) in MODELS.items() if s == stage}
    path = root / f"spec_zero{stage}.json"
    path.write_text(json.dumps(spec))
    return path


def _checkpoint_runs(root: Path, tokenizer: Path) -> list[tuple[list[str], dict]]:
    """(command, environment): ZeRO 1 in one process, ZeRO 3 on two ranks (torchrun)."""
    script = str(HF_SCRIPTS / "make_ds_checkpoint.py")
    return [
        ([sys.executable, script, "--spec", str(_spec(root, 1)), "--zero", "1", "--tokenizer", str(tokenizer)],
         offline_env(MASTER_PORT=str(free_port()))),
        ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
          script, "--spec", str(_spec(root, 3)), "--zero", "3", "--tokenizer", str(tokenizer)], offline_env()),
    ]


@functools.lru_cache(maxsize=None)
def hf_assets() -> HFAssets:
    from megatron_loop.export.convert import convert_checkpoint

    tokenizer = data_assets().tokenizer
    root = Path(tempfile.mkdtemp(prefix="looplm_hf_tests_"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for cmd, env in _checkpoint_runs(root, tokenizer)]
    try:
        outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    finally:  # a timeout or an interrupt leaves no checkpoint writer running behind the suite
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, out in zip(procs, outputs):
        assert proc.returncode == 0, out[-4000:]
    checkpoints = {name: root / "ckpt" / name for name in MODELS}
    exports = {name: root / "hf" / name for name in MODELS}
    for name in MODELS:
        if name != CLI_EXPORTED:  # tokenizer from the run config's data.tokenizer
            convert_checkpoint(checkpoints[name], exports[name])
    cli = subprocess.run([sys.executable, str(REPO / "tools" / "convert_to_hf.py"), "--checkpoint",
                          str(checkpoints[CLI_EXPORTED]), "--output", str(exports[CLI_EXPORTED]),
                          "--tokenizer", str(tokenizer), "--max-shard-size", "200KB"],
                         capture_output=True, text=True, env=offline_env(), timeout=300)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    return HFAssets(root, tokenizer, checkpoints, exports, cli.stdout + cli.stderr)


def eval_loops(model_name: str) -> tuple[int, ...]:
    """r = 1, K and 2K (NonLoop exports: r = 1 only)."""
    k = MODELS[model_name][1]["train_loops"]
    return (1,) if k == 1 else (1, k, 2 * k)


def left_padded_batch(pad: int):
    """Three prompts of 7, 4 and 6 tokens, left-padded to 7: (ids, attention mask)."""
    import torch

    gen = torch.Generator().manual_seed(5)
    ids = torch.full((3, 7), pad, dtype=torch.long)
    mask = torch.zeros((3, 7), dtype=torch.long)
    for b, n in enumerate([7, 4, 6]):
        ids[b, 7 - n:] = torch.randint(1, 600, (n,), generator=gen)
        mask[b, 7 - n:] = 1
    return ids, mask


def greedy_without_cache(model, ids, mask, new_tokens: int):
    """Greedy decoding that reruns the whole sequence at every step (no KV cache)."""
    import torch

    for _ in range(new_tokens):
        with torch.no_grad():
            logits = model(ids, attention_mask=mask, use_cache=False).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return ids
