"""The LoopLM model: megatron-core blocks, recurrence conditioning, parameter roles.

``LoopLM``/``build_model`` are imported lazily: megatron-core is slow to import, and light
modules such as ``megatron_loop.model.roles`` must not pay for it (every distributed rank does).
"""

__all__ = ["LoopLM", "LoopLMOutput", "build_model"]


def __getattr__(name):
    if name in __all__:
        from megatron_loop.model import looplm  # megatron-core (see the module docstring)

        return getattr(looplm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
