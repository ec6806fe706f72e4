"""``config/parallel.py``: the ``parallel:`` section's checks, each refusal with its message (the runs:
tests/integration/parallel/)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from megatron_loop.config.parallel import ParallelConfig
from megatron_loop.errors import LoopConfigError


def _model(**over):
    sizes = dict(num_attention_heads=8, num_key_value_heads=4, intermediate_size=64, vocab_size=256)
    sizes.update(over)
    return SimpleNamespace(**sizes)


def test_defaults_are_one_rank_without_sequence_parallelism():
    p = ParallelConfig()
    assert (p.tensor_model_parallel_size, p.sequence_parallel) == (1, False)
    p.validate()
    p.check_model(_model(vocab_size=255))  # N = 1 divides everything
    assert p.check_world(6, seq_length=7) == 6


def test_validate_refusals():
    with pytest.raises(LoopConfigError) as err:
        ParallelConfig(tensor_model_parallel_size=0).validate()
    assert str(err.value) == "parallel.tensor_model_parallel_size=0: expected an integer >= 1"
    with pytest.raises(LoopConfigError) as err:
        ParallelConfig(sequence_parallel=True).validate(prefix="p")
    assert str(err.value) == ("p.sequence_parallel=true: expected p.tensor_model_parallel_size > 1 (sequence "
                              "parallelism splits activations over the tensor-parallel group)")
    ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True).validate()


@pytest.mark.parametrize("key", ["num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"])
def test_every_split_dimension_must_divide(key):
    p = ParallelConfig(tensor_model_parallel_size=4)
    p.check_model(_model())
    with pytest.raises(LoopConfigError) as err:
        p.check_model(_model(**{key: 6}))
    assert str(err.value) == (f"parallel.tensor_model_parallel_size=4: expected a divisor of model.{key}=6 "
                              "(each tensor-parallel rank holds 1/4 of it)")


def test_check_world_gives_the_data_parallel_size_or_refuses():
    p = ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True)
    assert p.check_world(8, seq_length=64) == 4
    assert p.check_world(8) == 4  # no sequence length known yet: only the world is checked
    with pytest.raises(LoopConfigError) as err:
        p.check_world(3)
    assert str(err.value) == ("parallel.tensor_model_parallel_size=2: expected a divisor of the world size 3 "
                              "(ranks = tensor-parallel x data-parallel)")
    with pytest.raises(LoopConfigError) as err:
        p.check_world(4, seq_length=63)
    assert str(err.value) == ("parallel.sequence_parallel=true: expected train.seq_length=63 to be a multiple of "
                              "parallel.tensor_model_parallel_size=2")
