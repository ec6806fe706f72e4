"""``model/loss_chunk.py``: the chunked loss's tokens per chunk, one number read by the loss, the model and the
plan's memory check, and importable without torch (``--dry-run`` imports no torch)."""

from __future__ import annotations

import subprocess
import sys

from megatron_loop.model.loss_chunk import DEFAULT_CHUNK_TOKENS


def test_one_number_for_the_loss_and_the_memory_plan():
    from megatron_loop.model import loss
    from megatron_loop.training import memory_plan

    assert DEFAULT_CHUNK_TOKENS == 4096
    assert loss.DEFAULT_CHUNK_TOKENS is DEFAULT_CHUNK_TOKENS and memory_plan.DEFAULT_CHUNK_TOKENS is DEFAULT_CHUNK_TOKENS


def test_the_memory_plan_reads_it_without_torch():
    code = ("import sys, megatron_loop.model.loss_chunk, megatron_loop.training.memory_plan; "
            "print(sorted(m for m in ('torch', 'megatron') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
