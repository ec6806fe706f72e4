"""``checkpoint/manifest.py``: what a checkpoint records of the model (its signature) leaves out how the
model executes, so a run resumes with compile, recomputation or the loss kernel switched. (Missing and
corrupt files against the manifest: tests/integration/training/test_checkpoint_format.py.)"""

from __future__ import annotations

from megatron_loop import load_config


def test_execution_keys_stay_out_of_the_checkpoint_signature():
    """A run may resume with compile, recomputation or the loss kernel switched (same weights)."""
    from megatron_loop.checkpoint.manifest import model_signature

    a = load_config("examples/tiny_2x3.yaml")
    b = load_config("examples/tiny_2x3.yaml", overrides=[
        "model.compile=true", "model.recompute=auto", "model.recompute_budget_gib=8",
        "model.loss_implementation=chunked"])
    assert model_signature(a) == model_signature(b)
    assert model_signature(a) != model_signature(load_config("examples/tiny_2x3.yaml",
                                                             overrides=["model.train_loops=4"]))
