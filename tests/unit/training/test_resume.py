"""training/resume.py's ``apply_decision`` on an extended schedule (issues 33 and 43): one short line states the
lr of the next update and what the schedule does from there; by default (``train.schedule_on_resume:
continue_decay``) a run extended from its decay decays on from where the checkpoint stopped, and only
``rewarm``, asked for by name, goes back to the peak (optim/schedule.py)."""

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


def test_extending_a_run_in_its_decay_continues_the_decay_by_default_and_rewarms_only_by_name():
    # 60 -> 80 steps from the end of the run (split(60) = 3/51/6: update 60 ran at 0.1 x peak): the decay had
    # ended, so by default the rate stays at the floor; the new split 4/68/8 would jump back to the peak
    line, opt, sched = _resumed(60, 60, 80, "continue_decay")
    assert line == ("resume: lr of update 61: 0.001, the decay's final 0.1 x peak, held to update 80 "
                    "(train.schedule_on_resume=rewarm re-warms)")
    assert _lrs(opt, sched, 20) == pytest.approx([PEAK * 0.1] * 20)

    # rewarm, asked for by name: back to the re-derived schedule (the peak), naming a stable-phase checkpoint
    line, opt, sched = _resumed(60, 60, 80, "rewarm", [(60, "global_step60"), (50, "global_step50"),
                                                       (40, "global_step40")])
    assert line == ("resume: lr of update 61: 0.01, re-warmed from 0.1 to 1 x peak (train.schedule_on_resume=rewarm; "
                    "stable-phase checkpoint: global_step50)")
    assert _lrs(opt, sched, 20) == pytest.approx([PEAK * wsd_lambda(t, *wsd_split(80)) for t in range(61, 81)])
    assert _resumed(60, 60, 80, "rewarm", [(60, "global_step60")])[0].endswith("checkpoint: none kept)")

    # from update 57 (0.55 x peak, half way down): linear to 0.1 x peak at update 80
    line, opt, sched = _resumed(57, 60, 80, "continue_decay")
    assert line == ("resume: lr of update 58: 0.0053, continuing the decay to 0.1 x peak at update 80 "
                    "(train.schedule_on_resume=rewarm re-warms)")
    assert all(len(_resumed(*case)[0]) < 140 for case in ((60, 60, 80, "continue_decay"), (60, 60, 80, "rewarm"),
                                                           (57, 60, 80, "continue_decay"), (40, 60, 80, "rewarm")))
    assert _lrs(opt, sched, 23) == pytest.approx([PEAK * (0.55 - 0.45 * (t - 57) / 23) for t in range(58, 81)])
    assert sched.state_dict()["lr_lambdas"][0]["decay_from_step"] == 57  # checkpointed: a later resume keeps it


def test_extending_from_the_stable_phase_decays_over_the_new_end_whatever_the_mode():
    for mode in ("continue_decay", "rewarm"):  # the WSD way: the stable phase goes on
        line, opt, sched = _resumed(40, 60, 80, mode)
        assert line == "resume: lr of update 41: 0.01, stable phase; the decay runs over updates 73-80"
        assert _lrs(opt, sched, 40) == pytest.approx([PEAK * wsd_lambda(t, *wsd_split(80)) for t in range(41, 81)])
