"""WSD schedule (App. C.2 "Learning-rate scheduler", Table 3)."""

from __future__ import annotations

import pytest
import torch

from megatron_loop.optim import WSDSplit, wsd_lambda, wsd_scheduler, wsd_split


def paper_lambda(t: int, tw: int, ts: int, td: int) -> float:
    """The paper's formula, written out independently of the implementation."""
    if t <= tw:
        return t / tw
    if t <= tw + ts:
        return 1.0
    return 1 - 0.9 * (t - tw - ts) / td


@pytest.mark.parametrize(("steps", "split"), [(5394, (270, 4585, 539)), (2860, (143, 2431, 286))])
def test_table7_split_and_key_values(steps, split):
    assert wsd_split(steps) == WSDSplit(*split)
    tw, ts, td = split
    for t in (0, 1, tw // 2, tw, tw + 1, tw + ts, tw + ts + 1, tw + ts + td // 2, steps - 1, steps):
        assert wsd_lambda(t, *split) == pytest.approx(paper_lambda(t, *split), abs=1e-12)
    assert wsd_lambda(tw, *split) == 1.0  # warmup end: peak
    assert wsd_lambda(tw + ts, *split) == 1.0  # stable end: still peak
    assert wsd_lambda(steps, *split) == pytest.approx(0.1, abs=1e-12)  # final update: 0.1 x peak
    assert wsd_lambda(steps + 10, *split) == pytest.approx(0.1, abs=1e-12)  # held after the end


def test_scheduler_drives_both_groups_with_one_multiplier():
    """Update t (1-based) runs at peak * lambda(t), for the Muon and the AdamW group alike."""
    steps, peak = 40, 1e-3
    split = wsd_split(steps)
    a, b = torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([{"params": [a]}, {"params": [b]}], lr=peak)
    scheduler = wsd_scheduler(optimizer, steps)
    for t in range(1, steps + 1):
        lrs = [group["lr"] for group in optimizer.param_groups]
        assert lrs[0] == lrs[1] == pytest.approx(peak * paper_lambda(t, *split), rel=1e-12)
        optimizer.step()
        scheduler.step()
    state = scheduler.state_dict()
    assert state["last_epoch"] == steps and state["lr_lambdas"][0]["warmup"] == split.warmup


def test_configured_schedule_shape_reaches_scheduler_and_dry_run():
    """train.warmup_fraction / stable_fraction / min_lr_ratio drive both the trainer's scheduler
    and the dry-run plan (one definition of the split)."""
    from megatron_loop.config import config_from_dict
    from megatron_loop.plan import training_plan

    cfg = config_from_dict({"model": {"backbone": "tiny-llama"},
                            "train": {"max_steps": 200, "seq_length": 32, "warmup_fraction": 0.1,
                                      "stable_fraction": 0.7, "min_lr_ratio": 0.2}})
    plan = training_plan(cfg)
    assert (plan["warmup_steps"], plan["stable_steps"], plan["decay_steps"]) == (20, 140, 40)
    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = wsd_scheduler(opt, 200, 0.1, 0.7, 0.2)
    lrs = []
    for _ in range(200):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # update t runs at lambda(t): t = 1 .. 200
    assert lrs[19] == pytest.approx(1.0) and lrs[18] == pytest.approx(19 / 20)
    assert lrs[159] == pytest.approx(1.0) and lrs[160] < 1.0
    assert lrs[199] == pytest.approx(0.2)
