"""``eval/plots.py``'s run labels: what the model is (layout, conditioning in the paper's notation)
and how many items per task its scores rest on."""

from __future__ import annotations

from megatron_loop.eval.plots import model_label


def test_label_states_layout_conditioning_and_items_per_task():
    res = {"model": "runs/demo/hf", "label": None, "layout": "0+2x3+0", "conditioning": "H(channel, w=2)+LG",
           "items": {"piqa": 120, "clutrr": 120}}
    assert model_label(res) == "demo (0+2x3+0, H(channel, w=2)+LG, n = 120 per task)"  # NAME of runs/NAME/hf
    assert model_label({**res, "label": "demo", "items": {"piqa": 20, "facts": 36}}) == (
        "demo (0+2x3+0, H(channel, w=2)+LG, n = 20-36 per task)")
    plain = {"model": "m", "label": "base", "layout": "0+2x3+0", "conditioning": "none"}
    assert model_label(plain) == "base (0+2x3+0)"  # nothing to add: no conditioning, no items recorded
