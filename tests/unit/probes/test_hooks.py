"""``probes/hooks.py``: every block occurrence numbered in call order (prelude, loop 1's core blocks, ...,
coda), outputs replaceable, the Coda run alone as later occurrences. On a small module with the LoopLM's
three block lists; the probes on a real LoopLM: tests/unit/probes/test_runner.py."""

from __future__ import annotations

import torch
from torch import nn

from megatron_loop.probes.hooks import OccurrenceHooks


class _Block(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, h, offset, *, shift=0.0):
        return h * self.scale + offset + shift


class _Looped(nn.Module):
    """p + s x r + c blocks called in the LoopLM's order, with a positional and a keyword argument."""

    def __init__(self):
        super().__init__()
        self.prelude = nn.ModuleList([_Block(2.0)])
        self.core = nn.ModuleList([_Block(1.0), _Block(3.0)])
        self.coda = nn.ModuleList([_Block(5.0)])

    def forward(self, h, loops):
        for block in self.prelude:
            h = block(h, 1.0, shift=0.5)
        for _ in range(loops):
            for block in self.core:
                h = block(h, 1.0, shift=0.5)
        for block in self.coda:
            h = block(h, 1.0, shift=0.5)
        return h


def test_positions_follow_the_calls_and_restart_after_reset():
    model, seen = _Looped(), []
    with OccurrenceHooks(model, lambda pos, h_in, h_out: seen.append((pos, h_in.item(), h_out.item()))) as hooks:
        model(torch.tensor(1.0), loops=2)
        assert [p for p, _, _ in seen] == [1, 2, 3, 4, 5, 6]  # 1 + 2 x 2 + 1 occurrences
        assert seen[0] == (1, 1.0, 3.5)  # 1 x 2 + 1 + 0.5
        assert seen[2] == (3, 5.0, 16.5)  # the second core block of loop 1
        hooks.reset()
        seen.clear()
        model(torch.tensor(1.0), loops=1)
        assert [p for p, _, _ in seen] == [1, 2, 3, 4]
    seen.clear()
    model(torch.tensor(1.0), loops=1)
    assert seen == []  # the hooks are removed on exit


def test_a_returned_tensor_replaces_the_output():
    model = _Looped()
    skip_second = lambda pos, h_in, h_out: h_in if pos == 2 else None  # noqa: E731
    plain = model(torch.tensor(1.0), loops=1)
    with OccurrenceHooks(model, skip_second):
        skipped = model(torch.tensor(1.0), loops=1)
    # without occurrence 2 (core block 1: h + 1.5): 3.5 -> 3.5 * 3 + 1.5 = 12 -> 12 * 5 + 1.5 = 61.5
    assert plain.item() == ((3.5 + 1.5) * 3 + 1.5) * 5 + 1.5 and skipped.item() == 61.5


def test_run_coda_continues_the_numbering_with_the_forwards_arguments():
    model, seen = _Looped(), []
    with OccurrenceHooks(model, lambda pos, h_in, h_out: seen.append(pos)) as hooks:
        model(torch.tensor(1.0), loops=2)
        args, kwargs = hooks.coda_args
        assert args == (1.0,) and kwargs == {"shift": 0.5}
        seen.clear()
        out = hooks.run_coda(torch.tensor(2.0), after=3, coda_args=hooks.coda_args)
    assert seen == [4] and out.item() == 2.0 * 5 + 1.5  # the readout at r = 1: occurrence 1 + 2 x 1 + 1


def test_compiled_blocks_run_eagerly_inside_and_are_restored():
    model = _Looped()
    marker = object()
    model.core[0]._compiled_call_impl = marker
    with OccurrenceHooks(model, lambda *a: None):
        assert model.core[0]._compiled_call_impl is None
    assert model.core[0]._compiled_call_impl is marker
