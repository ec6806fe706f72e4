"""``optim/optimizer.py``: the optimizer is built from the ``train:`` section's optimizer keys. (Muon's
update itself: test_muon.py.)"""

from __future__ import annotations

import dataclasses

import optim_toy as toy
from megatron_loop.config import OptimizerSettings, config_from_dict
from megatron_loop.optim import build_optimizer


def test_optimizer_reads_every_optimizer_key_of_the_train_section():
    """The ``train:`` section is the optimizer's settings (declared once): a value set in YAML
    reaches the optimizer groups without a copy in between."""
    values = dict(lr=0.02, weight_decay=0.3, adam_beta1=0.8, adam_beta2=0.9, adam_eps=1e-6, muon_momentum=0.9,
                  muon_nesterov=False, muon_ns_steps=3, muon_scale="original", grad_clip=0.5, warmup_fraction=0.1,
                  stable_fraction=0.7, min_lr_ratio=0.2, optimizer="muon_adamw", muon_conditioning_matrices=False)
    assert set(values) == {f.name for f in dataclasses.fields(OptimizerSettings)}
    train = config_from_dict({"train": values}).train
    assert {key: getattr(train, key) for key in values} == values  # read as written, none dropped or renamed
    groups = build_optimizer(toy.FusedToy(toy.initial_weights(0)), train, clip_in_optimizer=False).param_groups
    expected = dict(lr=0.02, weight_decay=0.3, betas=(0.8, 0.9), eps=1e-6, momentum=0.9, nesterov=False, ns_steps=3,
                    muon_scale="original")
    assert len(groups) >= 2  # Muon's matrices and AdamW's rest
    assert all({k: g[k] for k in expected} == expected for g in groups)
