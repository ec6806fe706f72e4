"""lm-eval's ``HFLM`` for loop sweeps: the log-likelihoods of every r from one forward per batch.

Where the export's trajectory does not depend on r (``one_pass.sweep_passes``), :class:`LoopSweepLM`
answers the log-likelihood requests of the first r of a sweep for every r at once and serves the
others from memory; lm-eval still runs and scores each r (one ``simple_evaluate`` per r).
"""

from __future__ import annotations

import array
import contextlib
import hashlib

import torch
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import Collator
from tqdm.auto import tqdm


def _requests_key(requests) -> bytes:
    """A digest of the requests' tokens, in order (the same list comes back at every r; the paper's
    suites hold millions of tokens, which a tuple key would keep in memory as Python ints)."""
    digest = hashlib.sha256()
    for _, context, continuation in requests:
        digest.update(array.array("q", [len(context), len(continuation), *context, *continuation]).tobytes())
    return digest.digest()


def _sort_key(request) -> tuple:
    """HFLM's order of log-likelihood requests (``HFLM._loglikelihood_tokens``' ``_collate``): longest first."""
    tokens = request[1] + request[2]
    return -len(tokens), tuple(tokens)


def _context_key(request) -> tuple:
    """HFLM's grouping of requests that share context + continuation[:-1] (one forward serves the group)."""
    return tuple(request[1] + request[2][:-1])


class LoopSweepLM(HFLM):
    """lm-eval's ``HFLM`` around a LoopLM export that, inside :meth:`one_pass`, answers the
    log-likelihood requests of every loop count of the sweep from one forward per batch.

    Batches are HFLM's own (its ``Collator`` order and context grouping, ``batch_size`` requests
    each), each passed through HFLM's ``_loglikelihood_tokens`` once per r with the model call
    served from the one forward: the answers are bitwise those of a pass at each r (tested).
    ``progress=False`` also silences the per-request bars that lm-eval's evaluator cannot switch off.
    """

    def __init__(self, *args, progress: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.progress = progress
        self._loops: list[int] | None = None
        self._answers: dict[bytes, dict[int, list]] = {}  # request list (digest) -> r -> answers
        self._serving: int | None = None  # the r whose logits the model call returns
        self._batch: tuple[torch.Tensor, dict[int, torch.Tensor]] | None = None  # inputs, logits per r

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not self.progress)

    @contextlib.contextmanager
    def one_pass(self, loops):
        """Serve every r of ``loops`` from one forward per batch (the model's ``num_loops`` picks the r
        each ``simple_evaluate`` scores); answers are kept for the duration (floats, not logits)."""
        self._loops, self._answers = sorted(loops), {}
        try:
            yield self
        finally:
            self._loops, self._answers, self._batch = None, {}, None

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        r = None if self._loops is None else self.model.config.loops
        batch = self.batch_size if self.batch_size != "auto" else override_bs
        if r is None or r not in self._loops or not batch:  # outside a one-pass sweep: HFLM as it is
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        key = _requests_key(requests)
        if key not in self._answers:
            self._answers[key] = self._every_loop(requests, int(batch), disable_tqdm)
        return list(self._answers[key][r])

    def _every_loop(self, requests, batch_size: int, disable_tqdm: bool) -> dict[int, list]:
        """Answers of ``requests`` at every r, one forward per HFLM batch."""
        answers: dict[int, list] = {r: [None] * len(requests) for r in self._loops}
        bar = tqdm(total=len(requests), disable=disable_tqdm or not self.progress or self.rank != 0,
                   desc=f"loglikelihood requests, r = {', '.join(map(str, self._loops))} in one pass")
        try:
            for indices in self._hflm_batches(requests, batch_size):
                for r in self._loops:
                    self._serving = r
                    out = super()._loglikelihood_tokens([requests[i] for i in indices], disable_tqdm=True)
                    for i, answer in zip(indices, out, strict=True):
                        answers[r][i] = answer
                self._batch = None
                bar.update(len(indices))
        finally:
            self._serving, self._batch = None, None
            bar.close()
        return answers

    def _hflm_batches(self, requests, batch_size: int):
        """HFLM's batches of ``requests`` as index lists: its ``Collator`` order, ``batch_size`` forwards
        each, and with its logits cache (causal) every request that shares a representative's context +
        continuation[:-1] (HFLM scores them from the representative's logits). Passed to
        ``HFLM._loglikelihood_tokens`` on their own, they form exactly one of its batches."""
        if self.backend == "causal" and self.logits_cache:
            members: dict[tuple, list[int]] = {}
            for i, request in enumerate(requests):
                members.setdefault(_context_key(request), []).append(i)
            order = Collator(requests, sort_fn=_sort_key, group_fn=_context_key, group_by="contexts")
            for chunk in order.get_batched(n=batch_size):
                yield [i for representative in chunk for i in members[_context_key(representative)]]
        else:
            yield from Collator(list(range(len(requests))), sort_fn=lambda i: _sort_key(requests[i])).get_batched(
                n=batch_size)

    def _model_call(self, inps: torch.Tensor, attn_mask=None, labels=None) -> torch.Tensor:
        if self._serving is None:
            return super()._model_call(inps, attn_mask, labels)
        if self._batch is None or self._batch[0].shape != inps.shape or not torch.equal(self._batch[0], inps):
            # as HFLM._model_call: no graph, its mixed-precision setting
            with torch.no_grad(), torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                                 enabled=self.mixed_precision_dtype is not None):
                self._batch = (inps, self.model.loop_readouts(inps, self._loops))
        return self._batch[1][self._serving]
