"""megatron_loop: pretraining stack for looped language models (LoopLMs).

    from megatron_loop import load_config, build_model
    cfg = load_config("examples/llama_4x5.yaml", overrides=["model.train_loops=3"])
    model = build_model(cfg.model)
    out = model(input_ids, num_loops=r, labels=input_ids)   # .logits, .loss
"""

import warnings

# megatron-core warns four times on import when Transformer Engine and Apex are absent; the stack
# uses neither (its layers are megatron-core's local specs, the optimizer is ours), so on every
# machine the warning only hides the lines that matter. Scoped to that message.
warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*", category=UserWarning)

from megatron_loop.console import quiet_third_party  # noqa: E402

quiet_third_party()  # DeepSpeed's and transformers' false alarms, before either logs (console.py)

from megatron_loop.config import Config, ModelConfig, load_config  # noqa: E402
from megatron_loop.errors import LoopConfigError, LoopDataError  # noqa: E402


def build_model(config, device=None):
    """Build a :class:`~megatron_loop.model.LoopLM` (imported lazily: megatron-core is heavy)."""
    from megatron_loop.model import build_model as _build  # megatron-core: load_config stays light

    return _build(config, device=device)


__all__ = ["Config", "ModelConfig", "load_config", "build_model", "LoopConfigError", "LoopDataError"]
