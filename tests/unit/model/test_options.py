"""``model/options.py``: one forward's settings as one frozen object (the forward that reads them:
tests/unit/model/test_looplm.py)."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_loop.model.options import LoopOptions


def test_the_defaults_are_the_paper_forward_at_k():
    o = LoopOptions()
    assert (o.num_loops, o.timestep_grid, o.backprop_loops, o.loop_steps) == (None, None, None, None)
    assert (o.exit_criterion, o.exit_threshold, o.initial_state_seed) == ("none", 0.0, None)
    assert (o.return_trajectory, o.return_hidden, o.compute_logits, o.objective) == (False, False, True, None)


def test_of_sets_the_keywords_on_the_given_options_and_keeps_the_rest():
    base = LoopOptions(num_loops=3, initial_state_seed=11, loop_steps=(1, 2))
    assert LoopOptions.of(base) is base
    assert LoopOptions.of(base, {}) is base
    assert LoopOptions.of(None, None) == LoopOptions()
    changed = LoopOptions.of(base, {"return_hidden": True, "num_loops": 5})
    assert changed == LoopOptions(num_loops=5, initial_state_seed=11, loop_steps=(1, 2), return_hidden=True)
    assert base.num_loops == 3  # the given options are not changed


def test_an_unknown_keyword_is_refused_with_the_fields_listed():
    with pytest.raises(TypeError) as err:
        LoopOptions.of(None, {"num_loop": 2, "shortcut": True})
    names = [f.name for f in dataclasses.fields(LoopOptions)]
    assert str(err.value) == (f"LoopLM.forward got 'num_loop', which is no LoopOptions field; expected one of {names}")


def test_but_returns_a_changed_copy_and_the_object_is_frozen():
    o = LoopOptions(num_loops=2)
    p = o.but(compute_logits=False)
    assert (p.num_loops, p.compute_logits, o.compute_logits) == (2, False, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.num_loops = 4
    assert hash(o) == hash(LoopOptions(num_loops=2))  # usable as a key: equal options hash equal
