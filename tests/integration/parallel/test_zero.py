"""ZeRO 1, 2 and 3 (and stage 0) on 2 gloo ranks against a single-process torch reference.

``tests/support/dist_scripts/optim_zero.py`` trains ``FusedToy`` through ``build_engine`` (fp32, micro
batch 2, accumulation 2, different data per rank, 4 updates of which the third has its loss
multiplied by 1e6) and records the weights after every update. The reference is
``torch.optim.Muon(adjust_lr_fn="match_rms_adamw")`` on the unfused twin's separate q/k/v/gate/up
matrices + ``torch.optim.AdamW``, with ``torch.nn.utils.clip_grad_norm_(..., 1.0)`` on the
data-parallel mean of the raw gradients, and the same WSD LambdaLR on both.

Tolerance (fp32): every weight within 1e-6 absolute of the reference after every update
(observed <= 6e-8; the weights move by ~7e-2 over the run, and skipping the clip moves them by
~3e-2), reported grad norm within 1e-5 relative of the reference raw norm. The checkpoint round
trip must be bitwise.
"""

from __future__ import annotations


import pytest
import torch

import optim_toy as toy
from megatron_loop.model import roles
from megatron_loop.optim import wsd_scheduler
from testpaths import DIST_SCRIPTS

# deps: in the dependency drift check (tools/deps.py drift)
pytestmark = [pytest.mark.deps, pytest.mark.slow, pytest.mark.distributed]

SCRIPT = DIST_SCRIPTS / "optim_zero.py"

STAGES = (0, 1, 2, 3)  # 0: no ZeRO, the optimizer sees whole weights and clips itself
WORLD = 2
ATOL = 1e-6
LAUNCH_TIMEOUT_S = 480


@pytest.fixture(scope="session")
def zero_runs(tmp_path_factory) -> dict[int, list[dict]]:
    """Launch the 2-rank run of every stage (concurrently) and load each rank's record."""
    return toy.launch_stages(SCRIPT, STAGES, tmp_path_factory.mktemp("zero"), WORLD, LAUNCH_TIMEOUT_S)


def reference_run(clip: bool = True) -> tuple[list[dict[str, torch.Tensor]], list[float]]:
    """Weights (fused layout) after each update and the raw grad norms, single process."""
    twin = toy.UnfusedToy(toy.initial_weights(42))
    muon = torch.optim.Muon(
        twin.matrices(), lr=toy.RUN_LR, weight_decay=0.1, momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw"
    )
    adamw = torch.optim.AdamW(twin.others(), lr=toy.RUN_LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    schedulers = [wsd_scheduler(opt, toy.RUN_STEPS) for opt in (muon, adamw)]
    weights, norms = [], []
    for step in range(toy.RUN_STEPS):
        total = None
        for rank in range(WORLD):  # each rank accumulates its micro-batches, then the DP mean
            twin.zero_grad(set_to_none=True)
            for micro in range(toy.RUN_ACCUM):
                loss = twin(toy.batch(step, rank, micro, toy.RUN_MICRO), toy.RUN_MULTIPLIER.get(step, 1.0))
                (loss / toy.RUN_ACCUM).backward()
            grads = [p.grad.clone() for p in twin.parameters()]
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
        for param, grad in zip(twin.parameters(), total):
            param.grad = grad / WORLD
        norms.append(float(torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0 if clip else float("inf"))))
        for opt in (muon, adamw):
            opt.step()
        for scheduler in schedulers:
            scheduler.step()
        weights.append({name: w.detach().clone() for name, w in twin.fused().items()})
    return weights, norms


@pytest.fixture(scope="module")
def reference():
    return reference_run(clip=True)


@pytest.fixture(scope="module")
def unclipped_reference():
    return reference_run(clip=False)[0]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[name] - b[name]).abs().max()) for name in a)


@pytest.mark.parametrize("stage", STAGES)
def test_zero_matches_single_process_reference(stage, zero_runs, reference):
    rank0, rank1 = zero_runs[stage]
    ref_weights, _ = reference
    initial = rank0["weights"][0]
    assert max_diff(initial, toy.initial_weights(42)) == 0
    for step in range(toy.RUN_STEPS):
        got = rank0["weights"][step + 1]
        assert max_diff(got, ref_weights[step]) <= ATOL, f"ZeRO {stage} step {step}"
        assert max_diff(got, rank1["weights"][step + 1]) == 0  # both ranks hold the same model
    assert max_diff(ref_weights[-1], initial) > 0.05  # the weights really moved
    # both groups follow the WSD schedule with one peak lr: split(4) = 0/3/1 -> 1, 1, 1, 0.1
    assert rank0["lrs"] == [[pytest.approx(toy.RUN_LR * f)] * 2 for f in (1.0, 1.0, 1.0, 0.1)]
    assert rank0["group_names"] == ["muon", "adamw"]
    if stage >= 1:  # the Muon momentum really is sharded: each rank keeps half of the matrices
        matrices = sum(w.numel() for name, w in initial.items() if toy.FUSED_SPEC[name][1] == roles.MATRIX)
        assert rank0["partition_numels"][0] == matrices // WORLD


@pytest.mark.parametrize("stage", STAGES)
def test_zero_clips_raw_gradients(stage, zero_runs, reference, unclipped_reference):
    """Step 3's loss is x1e6: the raw norm is reported, clipped to 1 before Muon/AdamW, and the
    result equals the clipped reference (and visibly differs from an unclipped one)."""
    rank0, _ = zero_runs[stage]
    ref_weights, ref_norms = reference
    assert rank0["grad_norms"] == pytest.approx(ref_norms, rel=1e-5)
    huge = 2
    assert ref_norms[huge] > 1e5
    assert max_diff(rank0["weights"][huge + 1], ref_weights[huge]) <= ATOL
    assert max_diff(rank0["weights"][huge + 1], unclipped_reference[huge]) > 1e-2


@pytest.mark.parametrize("stage", STAGES)
def test_zero_checkpoint_restores_optimizer_state(stage, zero_runs):
    for record in zero_runs[stage]:  # every rank's own partition
        keys = {tuple(k) for k in record["state_keys"]}  # one entry per partition (stage 0: weight)
        assert keys == {("momentum_buffer",), ("exp_avg", "exp_avg_sq", "step")}
        assert record["momentum_nonzero"]
        assert record["states_equal"], "Muon momentum / AdamW moments not restored bitwise"
        assert record["weights_equal"] and record["scheduler_equal"] and record["lrs_equal"]
        assert record["continued_equal"], "a step after resume differs from the uninterrupted run"
