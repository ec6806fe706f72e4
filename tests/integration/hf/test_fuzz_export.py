"""Bad inputs closed as a class (issue 43): the export's Python API, fuzzed (hypothesis). The export's config
(``LoopLMConfig(...)``, ``from_pretrained(..., **kwargs)``) and the per-call arguments of ``forward`` and
``generate`` (``num_loops``, ``timestep_grid``, ``exit_criterion``, ``exit_threshold``, ``readout_loops``, the
token ids) either work or raise a ``ValueError`` naming the argument, in bounded time: never a bare
IndexError or RuntimeError from inside torch, never a loop count silently truncated, parsed or run for ever.

``LOOPLM_FUZZ_EXAMPLES=N`` runs N random examples per property (tests/support/fuzz_fixtures.py).
"""

from __future__ import annotations

import numbers

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fuzz_fixtures import TimedOut, fuzz_assets, fuzz_settings, time_bound, tiny_hf_config
from fuzz_strategies import FLOATS, INTEGERS, TEXT

BOUND_S = 30.0  # one call of a 1-block model at r <= 1024 on a few tokens takes well under a second


def loop_counts():
    return st.one_of(st.none(), st.integers(1, 6), INTEGERS, FLOATS, TEXT, st.booleans(),
                     st.sampled_from(["3", " 3", "x", 3.0, [2], torch.tensor(3)]))


def token_ids(vocab: int):
    return st.one_of(
        st.lists(st.integers(0, vocab - 1), min_size=1, max_size=5).map(lambda v: torch.tensor([v])),
        st.lists(st.integers(-3, vocab + 3), min_size=1, max_size=5).map(lambda v: torch.tensor([v])),
        st.sampled_from([torch.tensor([[vocab, 1, 2]]), torch.tensor([[-1, 2]]), torch.tensor([[1.0, 2.0]]),
                         torch.tensor([1, 2]), torch.zeros(1, 0, dtype=torch.long), torch.ones(1, 2, 2).long(),
                         torch.tensor([[True, False]]), [[1, 2]]]))


@pytest.fixture(scope="module")
def models():
    from megatron_loop.hf.modeling_looplm import LoopLMForCausalLM

    torch.manual_seed(0)
    return {"history": LoopLMForCausalLM(tiny_hf_config()).eval(),
            "loop_gating": LoopLMForCausalLM(tiny_hf_config(timestep="loop_gating")).eval()}


def _call(fn):
    """The outcome of ``fn()`` within the bound: ("ok", None) or ("raised", exception)."""
    try:
        with time_bound(BOUND_S), torch.no_grad():
            fn()
        return "ok", None
    except TimedOut:
        raise AssertionError(f"no answer within {BOUND_S} s") from None
    except Exception as e:  # noqa: BLE001 - the property is about which
        return "raised", e


def _valid_loops(value) -> bool:
    return value is None or (isinstance(value, numbers.Integral) and not isinstance(value, bool) and 1 <= value <= 1024)


def test_forward_and_generate_arguments(models):
    @fuzz_settings(60)
    @given(model=st.sampled_from(sorted(models)), ids=token_ids(320), num_loops=loop_counts(),
           grid=st.one_of(st.none(), st.sampled_from(["rescaled", "prefix"]), TEXT),
           criterion=st.one_of(st.none(), st.sampled_from(["none", "kl", "cosine", "q_exit"]), TEXT),
           threshold=st.one_of(st.none(), FLOATS, TEXT), generate=st.booleans())
    def fuzzed(model, ids, num_loops, grid, criterion, threshold, generate):
        m = models[model]
        kwargs = {k: v for k, v in (("num_loops", num_loops), ("timestep_grid", grid), ("exit_criterion", criterion),
                                    ("exit_threshold", threshold)) if v is not None}
        call = (lambda: m.generate(ids, max_new_tokens=2, do_sample=False, **kwargs)) if generate else \
            (lambda: m(ids, **kwargs))
        result, error = _call(call)
        if result == "raised":
            assert isinstance(error, (ValueError, TypeError)), repr(error)
            assert any(name in str(error) for name in (*kwargs, "input_ids", "num_loops")), (kwargs, repr(error))
        if not _valid_loops(num_loops):
            assert result == "raised" and ("num_loops" in str(error) or "input_ids" in str(error)), (num_loops, error)
        bad_ids = not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() or \
            ids.dtype == torch.bool or ids.numel() == 0 or bool((ids < 0).any() | (ids >= 320).any())
        if bad_ids:
            assert result == "raised", ids

    fuzzed()


def test_readout_loops(models):
    @fuzz_settings(25)
    @given(loops=st.one_of(st.lists(INTEGERS, max_size=4), INTEGERS, TEXT, st.lists(FLOATS, max_size=2)))
    def fuzzed(loops):
        m = models["history"]
        result, error = _call(lambda: m.loop_readouts(torch.tensor([[1, 2, 3]]), loops))
        if result == "raised":
            assert isinstance(error, (ValueError, TypeError)) and "readout_loops" in str(error), repr(error)

    fuzzed()


FIELDS = ["num_loops", "timestep_grid", "exit_criterion", "exit_threshold", "kv_cache_loops", "initial_state_seed",
          "history_window", "train_loops", "hidden_size", "num_attention_heads", "vocab_size", "rms_norm_eps",
          "initial_state_std", "timestep", "initial_injection", "block_norm", "exit_gate", "exit_mode", "loop_norm",
          "weighted_exit"]


WIDTHS = ("hidden_size", "num_attention_heads", "vocab_size")


def test_export_config_fields(models):
    from megatron_loop.hf.modeling_looplm import LoopLMForCausalLM

    small = st.one_of(st.integers(-2, 6), st.sampled_from([0.5, -1.0, 1e-6]))
    @fuzz_settings(40)
    @given(field=st.sampled_from(FIELDS), value=st.one_of(small, TEXT, st.none(), st.booleans(), FLOATS,
                                                          st.sampled_from([10**9, [1], {"a": 1}]),
                                                          st.sampled_from(["rescaled", "prefix", "kl", "dense",
                                                                           "loop_gating", "sandwich", "learned", "readout",
                                                                           "freeze", "branch_output"])))
    def fuzzed(field, value):
        if field in WIDTHS and isinstance(value, numbers.Real) and abs(value) > 64:
            return  # a model too large for memory is the plan's memory check (not a value check of the config)
        try:
            config = tiny_hf_config(**{field: value})
        except ValueError as e:
            assert field in str(e) or "LoopLMConfig" in str(e), (field, value, e)
            return
        result, error = _call(lambda: LoopLMForCausalLM(config)(torch.tensor([[1, 2, 3]])))
        if result == "raised":  # a config it accepted must build and run, or say which setting it cannot run
            assert isinstance(error, ValueError), (field, value, repr(error))

    fuzzed()


def test_from_pretrained_keyword_arguments():
    from transformers import AutoModelForCausalLM

    export = fuzz_assets().export

    @fuzz_settings(10)
    @given(field=st.sampled_from(["num_loops", "history_window", "timestep_grid", "exit_criterion", "hidden_size",
                                  "vocab_size", "core_layers"]), value=st.one_of(st.integers(-1, 5), TEXT,
                                                                                st.sampled_from([10**9, 2.7, "3"])))
    def fuzzed(field, value):
        if field in WIDTHS and isinstance(value, int) and value > 64:
            return  # a width of 10**9 is refused by the allocator (the weights are built before they are compared)
        try:
            with time_bound(BOUND_S):
                AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True, **{field: value})
        except ValueError as e:
            assert field in str(e), (field, value, e)
        except RuntimeError as e:  # transformers' load report: raised with our line naming the config field
            assert "LoopLM weights do not" in str(e) and (field in str(e) or "layout" in str(e)), (field, value, e)

    fuzzed()
