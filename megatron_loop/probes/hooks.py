"""Forward hooks that see every block occurrence of a LoopLM (App. C.4 effective positions).

Every call of a prelude, shared (core) or coda block is one occurrence at an effective position
l = 1..D, numbered in call order: prelude, then loop 1's shared blocks, ..., then the coda.
The callback receives the block's own input and output ``[s, b, d]``; returning a tensor
replaces the output (how a skip run replaces occurrence i's output by its input).

:meth:`OccurrenceHooks.run_coda` runs the Coda alone on a state h^r as the occurrences
a + s r + 1, ...: the Coda readout at r of a one-pass probe sweep (``runner.py``), with the
arguments (rotary tables) the Coda received in the forward, so it computes what a forward at r does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

BlockCallback = Callable[[int, torch.Tensor, torch.Tensor], "torch.Tensor | None"]


class OccurrenceHooks:
    """Context manager: ``callback(position, h_in, h_out)`` on each block occurrence.

    Call :meth:`reset` before each forward so positions restart at 1.
    """

    def __init__(self, model: nn.Module, callback: BlockCallback):
        self.blocks = [*model.prelude, *model.core, *model.coda]
        self.coda = list(model.coda)
        self.callback = callback
        self.position = 0
        self.coda_args: tuple | None = None  # (args, kwargs) after h of the last Coda call: its rotary tables
        self._handles: list = []

    def reset(self) -> None:
        self.position = 0

    def _hook(self, module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor | None:
        self.position += 1
        if self.coda and module is self.coda[0]:
            self.coda_args = (args[1:], kwargs)
        return self.callback(self.position, args[0], output)

    def run_coda(self, h: torch.Tensor, after: int, coda_args: tuple) -> torch.Tensor:
        """The Coda blocks on ``h`` [s, b, d] as occurrences ``after`` + 1, ... (hooked like a forward's),
        called with ``coda_args`` (another forward's :attr:`coda_args`, same inputs' shape and dtype)."""
        args, kwargs = coda_args
        self.position = after
        for block in self.coda:
            h = block(h, *args, **kwargs)
        return h

    def __enter__(self) -> "OccurrenceHooks":
        # Blocks compiled in place (``model.compile``, nn.Module.compile) would trace these
        # stateful hooks into their graphs; probes run the blocks eagerly instead, restored on exit.
        self._compiled = [getattr(block, "_compiled_call_impl", None) for block in self.blocks]
        for block in self.blocks:
            block._compiled_call_impl = None
        self._handles = [block.register_forward_hook(self._hook, with_kwargs=True) for block in self.blocks]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for block, compiled in zip(self.blocks, self._compiled):
            block._compiled_call_impl = compiled
