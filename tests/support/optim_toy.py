"""A tiny LoopLM-shaped model for the optimizer tests, fused (megatron-core layout) and unfused.

``FusedToy`` has a fused GQA QKV (2 query groups x 2 heads/group, head_dim 4) and a fused
SwiGLU gate/up, tagged with ``roles.set_role`` and the QKV/GateUp splits, plus an embedding, a
head, two norms and two conditioning parameters. ``UnfusedToy`` holds separate q/k/v/gate/up
matrices (HF style) and builds the fused weights from them, so both run the very same forward
(:func:`toy_loss`) and their gradients agree bitwise: the reference optimizer
(``torch.optim.Muon`` on the separate matrices + ``torch.optim.AdamW``) sees exactly the
gradients ``MuonAdamW`` sees on the fused ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from megatron_loop.model import roles

VOCAB, HIDDEN, GROUPS, HEADS_PER_GROUP, HEAD_DIM, FFN, SEQ = 16, 8, 2, 2, 4, 12, 6
QKV = roles.QKVSplit(num_groups=GROUPS, heads_per_group=HEADS_PER_GROUP, head_dim=HEAD_DIM)
GATE_UP = roles.GateUpSplit(ffn_size=FFN)
HEADS = GROUPS * HEADS_PER_GROUP
QKV_ROWS = GROUPS * (HEADS_PER_GROUP + 2) * HEAD_DIM

# the 2-rank ZeRO run (tests/support/dist_scripts/optim_zero.py) and its reference (tests/integration/parallel/test_zero.py)
RUN_LR = 0.02
RUN_STEPS = 4
RUN_ACCUM = 2
RUN_MICRO = 2
RUN_MULTIPLIER = {2: 1e6}  # step index -> loss multiplier: a huge raw gradient clipping must tame

# name -> (shape, role, split); names are only used by the tests to line the twins up
FUSED_SPEC: dict[str, tuple[tuple[int, ...], str, object]] = {
    "embedding": ((VOCAB, HIDDEN), roles.EMBEDDING, None),
    "cond_vector": ((HIDDEN,), roles.CONDITIONING, None),
    "cond_scalar": ((1,), roles.CONDITIONING, None),
    "norm1": ((HIDDEN,), roles.NORM, None),
    "qkv": ((QKV_ROWS, HIDDEN), roles.MATRIX, QKV),
    "proj": ((HIDDEN, HEADS * HEAD_DIM), roles.MATRIX, None),
    "norm2": ((HIDDEN,), roles.NORM, None),
    "fc1": ((2 * FFN, HIDDEN), roles.MATRIX, GATE_UP),
    "fc2": ((HIDDEN, FFN), roles.MATRIX, None),
    "head": ((VOCAB, HIDDEN), roles.HEAD, None),
}
SPLIT_NAMES = {"qkv": ("q", "k", "v"), "fc1": ("gate", "up")}


def initial_weights(seed: int = 42) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, (shape, role, _) in FUSED_SPEC.items():
        if role == roles.NORM:
            weights[name] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif role == roles.CONDITIONING:
            weights[name] = 0.5 * torch.randn(shape, generator=gen)
        else:
            weights[name] = 0.3 * torch.randn(shape, generator=gen)
    return weights


def toy_loss(w: dict[str, torch.Tensor], tokens: torch.Tensor, multiplier: float = 1.0) -> torch.Tensor:
    """Next-token CE of one pre-norm attention + SwiGLU block (causal, GQA)."""
    x = w["embedding"][tokens] + w["cond_scalar"] * w["cond_vector"]
    h = F.rms_norm(x, (HIDDEN,), w["norm1"])
    qkv = (h @ w["qkv"].T).view(*h.shape[:2], GROUPS, HEADS_PER_GROUP + 2, HEAD_DIM)
    q = qkv[..., :HEADS_PER_GROUP, :].flatten(2, 3).transpose(1, 2)  # (B, heads, T, hd)
    k = qkv[..., HEADS_PER_GROUP, :].repeat_interleave(HEADS_PER_GROUP, dim=2).transpose(1, 2)
    v = qkv[..., HEADS_PER_GROUP + 1, :].repeat_interleave(HEADS_PER_GROUP, dim=2).transpose(1, 2)
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
    x = x + attn @ w["proj"].T
    h = F.rms_norm(x, (HIDDEN,), w["norm2"])
    gate, up = (h @ w["fc1"].T).chunk(2, dim=-1)
    x = x + (F.silu(gate) * up) @ w["fc2"].T
    logits = x[:, :-1] @ w["head"].T
    return multiplier * F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


class FusedToy(torch.nn.Module):
    """The model under test: megatron-core style fused matrices, roles + splits attached."""

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        for name, (_, role, split) in FUSED_SPEC.items():
            param = torch.nn.Parameter(weights[name].clone())
            roles.set_role(param, role, split)
            self.register_parameter(name, param)

    def forward(self, tokens: torch.Tensor, multiplier: float = 1.0) -> torch.Tensor:
        return toy_loss({name: getattr(self, name) for name in FUSED_SPEC}, tokens, multiplier)


class UnfusedToy(torch.nn.Module):
    """The reference twin: separate q/k/v and gate/up matrices (HF style), same function."""

    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        for name, (_, _, split) in FUSED_SPEC.items():
            if split is None:
                self.register_parameter(name, torch.nn.Parameter(weights[name].clone()))
                continue
            for part, rows in zip(SPLIT_NAMES[name], split.row_index()):
                self.register_parameter(part, torch.nn.Parameter(weights[name][rows].clone()))

    def matrices(self) -> list[torch.nn.Parameter]:
        return [self.q, self.k, self.v, self.proj, self.gate, self.up, self.fc2]

    def others(self) -> list[torch.nn.Parameter]:
        return [self.embedding, self.cond_vector, self.cond_scalar, self.norm1, self.norm2, self.head]

    def fused(self) -> dict[str, torch.Tensor]:
        """Full weights in the fused layout (differentiable: gradients flow to the parts)."""
        weights = {name: getattr(self, name) for name, (_, _, split) in FUSED_SPEC.items() if split is None}
        for name, (_, _, split) in FUSED_SPEC.items():
            if split is None:
                continue
            parts = [getattr(self, part) for part in SPLIT_NAMES[name]]
            order = torch.cat(split.row_index())
            weights[name] = torch.cat(parts)[torch.argsort(order)]
        return weights

    def forward(self, tokens: torch.Tensor, multiplier: float = 1.0) -> torch.Tensor:
        return toy_loss(self.fused(), tokens, multiplier)


def batch(step: int, rank: int, micro: int, size: int = 2) -> torch.Tensor:
    """Deterministic, different tokens for every (step, rank, micro-batch)."""
    gen = torch.Generator().manual_seed(1000 * step + 100 * rank + micro)
    return torch.randint(0, VOCAB, (size, SEQ), generator=gen)


def launch_stages(script: Path, stages, root: Path, world: int = 2, timeout: float = 480) -> dict[int, list[dict]]:
    """Run ``script --stage S --out ROOT/stageS --ckpt ROOT/ckptS`` on ``world`` gloo ranks for every
    stage (concurrently) and load each rank's ``ROOT/stageS.rank{r}.pt``; a failed rank fails the
    test with its log. Shared by the ZeRO and bf16 precision tests."""
    import pytest

    import socket

    # one port per concurrent stage, all bound at once so that no two stages get the same one
    # (free_port's socket closes at once: two calls in a row may be given the same port)
    sockets = [socket.socket() for _ in stages]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    launches = {}
    for stage, port in zip(stages, ports):
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            log = open(root / f"stage{stage}.rank{rank}.log", "w")
            cmd = [sys.executable, str(script), "--stage", str(stage), "--out", str(root / f"stage{stage}"),
                   "--ckpt", str(root / f"ckpt{stage}")]
            procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        launches[stage] = procs
    records = {}
    deadline = time.monotonic() + timeout
    for stage, procs in launches.items():
        # a rank that fails ends its stage at once: the other ranks would wait for it until the timeout
        while any(proc.poll() is None for proc, _ in procs) and time.monotonic() < deadline:
            if any(proc.poll() not in (None, 0) for proc, _ in procs):
                break
            time.sleep(0.2)
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            log.close()
        failed = [rank for rank, (proc, _) in enumerate(procs) if proc.returncode != 0]
        if failed:
            tail = (root / f"stage{stage}.rank{failed[0]}.log").read_text()[-4000:]
            pytest.fail(f"{script.name} stage {stage} rank {failed[0]} failed:\n{tail}")
        records[stage] = [torch.load(root / f"stage{stage}.rank{r}.pt") for r in range(world)]
    return records
