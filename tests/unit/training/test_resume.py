"""training/resume.py's ``apply_decision`` on an extended schedule (issue 33 item 9): the line it prints
says what the lr does after the extension, and ``train.schedule_on_resume: continue_decay`` decays
on from where the checkpoint stopped instead of going back to the peak (optim/schedule.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron_loop.optim.schedule import wsd_lambda, wsd_scheduler, wsd_split
from megatron_loop.training.resume import Hyperparameters, ResumeDecision, apply_decision

PEAK = 1e-2


def _resumed(done: int, old_total: int, new_total: int, mode: str, kept=()):
    """A scheduler that ran ``done`` updates of an ``old_total`` schedule, then resumed with
    ``max_steps = new_total`` (the fresh engine's settings put back as training/setup.py does)."""
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    groups = [{"params": [params[0]], "name": "muon"}, {"params": [params[1]], "name": "adamw"}]
    fresh_opt = torch.optim.SGD(groups, lr=PEAK)
    fresh = Hyperparameters.of(SimpleNamespace(lr_scheduler=wsd_scheduler(fresh_opt, new_total)), fresh_opt)
    opt = torch.optim.SGD([dict(g) for g in groups], lr=PEAK)
    sched = wsd_scheduler(opt, old_total)
    for _ in range(done):
        opt.step()
        sched.step()
    decision = ResumeDecision(schedule=[f"train.max_steps {old_total} -> {new_total}"])
    line = apply_decision(SimpleNamespace(lr_scheduler=sched), opt, fresh, decision, mode, list(kept))
    return line, opt, sched


def _lrs(opt, sched, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_extending_a_run_in_its_decay_says_it_rewarms_or_continues_the_decay():
    # 60 -> 80 steps from the end of the run (split(60) = 3/51/6: update 60 ran at 0.1 x peak)
    line, opt, sched = _resumed(60, 60, 80, "rederive", [(60, "global_step60"), (50, "global_step50"),
                                                         (40, "global_step40")])
    assert line == ("resume: schedule re-derived: WSD warmup/stable/decay 3/51/6 -> 4/68/8 updates; lr of update 61: "
                    "0.001 -> 0.01; the checkpoint is in its decay (0.1 x peak at update 60) and the new schedule "
                    "goes back up to 1 x peak (re-warmed); to decay on instead set "
                    "train.schedule_on_resume=continue_decay, or resume from a checkpoint of the stable phase "
                    "(update <= 54; kept: global_step50) to decay over the new end")
    assert _lrs(opt, sched, 20) == pytest.approx([PEAK * wsd_lambda(t, *wsd_split(80)) for t in range(61, 81)])
    assert "(update <= 54; none is kept) to decay" in _resumed(60, 60, 80, "rederive", [(60, "global_step60")])[0]

    # continue_decay from update 57 (0.55 x peak, half way down): linear to 0.1 x peak at update 80
    line, opt, sched = _resumed(57, 60, 80, "continue_decay")
    assert line.endswith("lr of update 58: 0.004 -> 0.00530435; continuing the decay "
                         "(train.schedule_on_resume=continue_decay): linear from 0.55 x peak after update 57 to "
                         "0.1 x peak at update 80")
    assert _lrs(opt, sched, 23) == pytest.approx([PEAK * (0.55 - 0.45 * (t - 57) / 23) for t in range(58, 81)])
    assert sched.state_dict()["lr_lambdas"][0]["decay_from_step"] == 57  # checkpointed: a later resume keeps it


def test_extending_from_the_stable_phase_decays_over_the_new_end_whatever_the_mode():
    for mode in ("rederive", "continue_decay"):  # the WSD way: the stable phase goes on
        line, opt, sched = _resumed(40, 60, 80, mode)
        assert line.endswith("lr of update 41: 0.01 -> 0.01; the decay runs over updates 73-80")
        assert _lrs(opt, sched, 40) == pytest.approx([PEAK * wsd_lambda(t, *wsd_split(80)) for t in range(41, 81)])
