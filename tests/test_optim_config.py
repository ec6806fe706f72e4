"""DeepSpeed config files and batch arithmetic."""

from __future__ import annotations

import pytest

from megatron_loop.errors import LoopConfigError
from megatron_loop.config.deepspeed import read_ds_config
from megatron_loop.config.deepspeed import resolve_ds_config

RUN = dict(micro_batch_size=38, grad_accum=6, data_parallel_size=8, bf16=True, grad_clip=1.0)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_shipped_configs_resolve(stage):
    config = resolve_ds_config(read_ds_config(zero_stage=stage), **RUN)
    assert config["zero_optimization"]["stage"] == stage
    # App. C.2: 38 x 6 micro-batches on 8 GPUs = 1,824 sequences
    assert config["train_batch_size"] == 1824
    assert config["train_micro_batch_size_per_gpu"] == 38 and config["gradient_accumulation_steps"] == 6
    assert config["gradient_clipping"] == 1.0 and config["bf16"]["enabled"] is True
    assert config["zero_allow_untested_optimizer"] is True
    assert "optimizer" not in config and "scheduler" not in config
    assert "auto" not in str(config)


def test_cpu_fp32_override_and_stage0():
    config = resolve_ds_config(read_ds_config(zero_stage=1), **{**RUN, "bf16": False})
    assert config["bf16"]["enabled"] is False
    stage0 = resolve_ds_config(read_ds_config(zero_stage=0), **{**RUN, "bf16": False})
    assert stage0["gradient_clipping"] == 0.0  # the optimizer clips (and reports) at stage 0
    with pytest.raises(LoopConfigError, match="bf16 needs ZeRO"):
        resolve_ds_config(read_ds_config(zero_stage=0), **RUN)


def test_batch_arithmetic_is_checked_not_duplicated():
    config = {**read_ds_config(zero_stage=2), "train_batch_size": 1000}
    with pytest.raises(LoopConfigError, match="disagrees"):
        resolve_ds_config(config, **RUN)
    config = {**read_ds_config(zero_stage=2), "train_batch_size": 1824, "gradient_accumulation_steps": 6}
    assert resolve_ds_config(config, **RUN)["train_batch_size"] == 1824
    with pytest.raises(LoopConfigError, match="gradient_clipping"):
        resolve_ds_config({**read_ds_config(zero_stage=2), "gradient_clipping": 0.5}, **RUN)


def test_config_may_not_name_an_optimizer_or_scheduler():
    with pytest.raises(LoopConfigError, match="optimizer"):
        resolve_ds_config({**read_ds_config(zero_stage=1), "optimizer": {"type": "Muon"}}, **RUN)
    with pytest.raises(LoopConfigError, match="ZeRO stage 3, expected 2"):
        read_ds_config(read_ds_config(zero_stage=3), zero_stage=2)


def test_optimizer_reads_every_optimizer_key_of_the_train_section():
    """The ``train:`` section is the optimizer's settings (declared once): a value set in YAML
    reaches the optimizer groups without a copy in between."""
    import dataclasses

    import optim_toy as toy
    from megatron_loop.config import OptimizerSettings, config_from_dict
    from megatron_loop.optim import build_optimizer

    values = dict(lr=0.02, weight_decay=0.3, adam_beta1=0.8, adam_beta2=0.9, adam_eps=1e-6, muon_momentum=0.9,
                  muon_nesterov=False, muon_ns_steps=3, muon_scale="original", grad_clip=0.5, warmup_fraction=0.1,
                  stable_fraction=0.7, min_lr_ratio=0.2, optimizer="muon_adamw", muon_conditioning_matrices=False)
    assert set(values) == {f.name for f in dataclasses.fields(OptimizerSettings)}
    train = config_from_dict({"train": values}).train
    assert isinstance(train, OptimizerSettings)
    groups = build_optimizer(toy.FusedToy(toy.initial_weights(0)), train, clip_in_optimizer=False).param_groups
    expected = dict(lr=0.02, weight_decay=0.3, betas=(0.8, 0.9), eps=1e-6, momentum=0.9, nesterov=False, ns_steps=3,
                    muon_scale="original")
    assert all({k: g[k] for k in expected} == expected for g in groups)
