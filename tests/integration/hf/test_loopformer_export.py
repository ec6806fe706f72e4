"""LoopFormer's shortcut modulation (``model.timestep: shortcut``) through the HF export: the exported model
equals the training model at several budgets r (the uniform schedule dt = 1/r, LoopFormer's inference
grid), on the prefix grid and on LoopFormer's non-uniform step schedules (``loop_steps``), and the folder
converts back to the same training weights."""

from __future__ import annotations

import json

import torch

from megatron_loop import build_model
from megatron_loop.config import build_model_config

TOLERANCE = 1e-5


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def test_shortcut_export_matches_the_training_model_at_every_budget(tmp_path):
    from transformers import AutoModelForCausalLM

    from megatron_loop.export.convert import export_state_dict
    from megatron_loop.export.load import load_looplm_from_hf

    cfg = build_model_config(dict(backbone="tiny-qwen", vocab_size=640, prelude_layers=1, core_layers=2,
                                  coda_layers=1, train_loops=4, timestep="shortcut", recompute="none"))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():  # gates and scales well away from their near-zero start
        for name, p in model.named_parameters():
            if "adaln" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
    folder = export_state_dict(model.state_dict(), cfg, tmp_path / "hf")
    assert json.loads((folder / "config.json").read_text())["timestep"] == "shortcut"
    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    ids = torch.randint(0, 600, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = {}
        for r in (1, 2, 4, 6):
            logits[r] = model(ids, num_loops=r).logits
            assert _relative_error(hf(ids, num_loops=r).logits, logits[r]) < TOLERANCE, r
        want = model(ids, num_loops=2, timestep_grid="prefix").logits
        assert _relative_error(hf(ids, num_loops=2, timestep_grid="prefix").logits, want) < TOLERANCE
        assert _relative_error(want, logits[2]) > 1e-3  # the two grids differ: the match above is not vacuous
        for steps in ((1, 3), (3, 1), (2, 1, 1)):  # LoopFormer's step schedules at a budget of len(steps) loops
            want = model(ids, loop_steps=steps).logits
            assert _relative_error(hf(ids, loop_steps=steps).logits, want) < TOLERANCE, steps
        assert _relative_error(model(ids, loop_steps=(1, 3)).logits, model(ids, loop_steps=(3, 1)).logits) > 1e-3
    back = load_looplm_from_hf(folder).state_dict()
    state = model.state_dict()
    assert all(torch.equal(back[k], v) for k, v in state.items() if not k.endswith("_extra_state"))
