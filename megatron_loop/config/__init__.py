"""Typed, validated configuration: YAML -> dataclasses, ``--set key.path=value`` overrides.

Modules: ``presets`` (the App. C.1 backbones), ``sections`` (the dataclasses: keys, types,
defaults), ``validation`` (the checks, one ``error:`` line naming the key), ``loading`` (YAML,
overrides, typed construction), ``paths`` (dataset prefixes, relative paths made absolute),
``deepspeed`` (the DeepSpeed JSON: where it is, read, checked against the YAML), ``parallel`` (the
``parallel:`` section).
Everything a caller needs is importable from here::

    from megatron_loop.config import load_config
    cfg = load_config("examples/llama_4x5.yaml", overrides=["model.train_loops=3"])
"""

from megatron_loop.config.loading import build_model_config, config_from_dict, load_config
from megatron_loop.config.paths import VALID_SUFFIX, prefix_exists, resolve_paths, sibling_valid_prefix
from megatron_loop.config.presets import BACKBONES, LLAMA3_ROPE_SCALING
from megatron_loop.config.parallel import ParallelConfig
from megatron_loop.config.sections import (SECTIONS, Config, DataConfig, LoggingConfig, ModelConfig, OptimizerSettings,
                                           TrainConfig)
from megatron_loop.config.validation import (RECOMPUTE_MODES, DATA_ORDERS, HISTORY_INJECTIONS, INITIAL_INJECTIONS,
                                             LOOP_GATING_REFERENCES, LOOP_SAMPLINGS, LOSS_IMPLEMENTATIONS,
                                             NOISY_INITIAL_INJECTIONS, OPTIMIZERS, TIMESTEP_GRIDS, TIMESTEPS,
                                             check_loop_sampling, loop_range)

__all__ = [
    "BACKBONES", "RECOMPUTE_MODES", "DATA_ORDERS", "HISTORY_INJECTIONS", "INITIAL_INJECTIONS", "LLAMA3_ROPE_SCALING",
    "LOOP_GATING_REFERENCES", "LOOP_SAMPLINGS", "LOSS_IMPLEMENTATIONS", "NOISY_INITIAL_INJECTIONS", "OPTIMIZERS",
    "SECTIONS", "TIMESTEPS", "TIMESTEP_GRIDS", "VALID_SUFFIX", "Config", "DataConfig",
    "LoggingConfig", "ModelConfig", "OptimizerSettings", "ParallelConfig", "TrainConfig", "build_model_config", "check_loop_sampling",
    "config_from_dict", "load_config", "loop_range", "prefix_exists", "resolve_paths", "sibling_valid_prefix",
]
