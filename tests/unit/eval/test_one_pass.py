"""One-pass loop sweeps (``eval/one_pass.py``, the export's ``loop_readouts``): one forward at r_max
that reads Coda + head after each requested loop gives, for every conditioning kind whose trajectory
does not depend on r, logits bitwise equal to ``forward(num_loops=r)``; where it depends on r (timestep
conditioning on the rescaled grid) the readout is refused and the sweep falls back to one pass per r."""

from __future__ import annotations

import pytest
import torch

from megatron_loop.eval.one_pass import sweep_passes
from megatron_loop.hf.modeling_looplm import LoopLMConfig, LoopLMForCausalLM, timestep_features

VOCAB = 61
K = 4

# conditioning kinds whose trajectory does not depend on r (the prefix grid needs r <= K)
INDEPENDENT = {
    "plain": {},
    "scalar_injections": {"initial_injection": "scalar", "history_injection": "scalar"},
    "channel_injections": {"initial_injection": "channel", "history_injection": "channel", "history_window": 2},
    "residual_channel_dense": {"initial_injection": "residual_channel", "history_injection": "dense",
                               "history_window": 2},
    "dense_injection": {"initial_injection": "dense"},
    "loop_gating_prefix": {"timestep": "loop_gating", "timestep_grid": "prefix", "initial_injection": "scalar",
                           "history_injection": "scalar"},
    "loop_gating_injected_prefix": {"timestep": "loop_gating", "timestep_grid": "prefix",
                                    "loop_gating_reference": "injected", "initial_injection": "channel"},
    "branch_gating_prefix": {"timestep": "branch_gating", "timestep_grid": "prefix", "history_injection": "channel"},
    "adaln_prefix": {"timestep": "adaln", "timestep_grid": "prefix", "initial_injection": "dense"},
    "exit_cosine": {"exit_criterion": "cosine", "exit_threshold": 0.05},
    "exit_kl": {"exit_criterion": "kl", "exit_threshold": 0.02, "history_injection": "scalar"},
}


def _model(**fields) -> LoopLMForCausalLM:
    torch.manual_seed(0)
    config = LoopLMConfig(prelude_layers=1, core_layers=2, coda_layers=1, train_loops=K, hidden_size=32,
                          intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          vocab_size=VOCAB, **fields)
    model = LoopLMForCausalLM(config).eval()
    with torch.no_grad():  # away from the identity initialisation of the conditioning, so it matters
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("kind", list(INDEPENDENT))
def test_readouts_are_bitwise_the_forward_at_each_r(kind):
    model = _model(**INDEPENDENT[kind])
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    loops = [1, 2, 3, 4] if model.config.timestep != "none" else [1, 2, 3, 5, 6]
    with torch.no_grad():
        readouts = model.loop_readouts(ids, loops)
        assert list(readouts) == loops
        for r in loops:
            assert torch.equal(readouts[r], model(ids, num_loops=r).logits), f"{kind}: r = {r}"
        assert not torch.equal(readouts[loops[0]], readouts[loops[-1]])  # the readouts really differ per r
        if model.config.exit_criterion != "none":  # some tokens exit before the cap: the rule was exercised
            exits = model(ids, num_loops=loops[-1]).exit_loops
            assert exits.min() < loops[-1]


def test_readouts_with_a_padding_mask_match_the_forward():
    model = _model(history_injection="channel", history_window=2)
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        readouts = model.loop_readouts(ids, [2, 5], attention_mask=mask)
        for r in (2, 5):
            assert torch.equal(readouts[r], model(ids, attention_mask=mask, num_loops=r).logits)


@pytest.mark.parametrize("timestep", ["loop_gating", "branch_gating", "adaln"])
def test_the_rescaled_grid_depends_on_r_and_is_refused(timestep):
    """t_l = l/r, dt = 1/r (Eq. timestep_features): psi_0 already differs between r = 2 and r = 3, so
    the states after loop 1 differ and a readout at r = 2 out of the r = 3 run would be wrong."""
    model = _model(timestep=timestep)
    assert not torch.equal(timestep_features(2, K, "rescaled")[0], timestep_features(3, K, "rescaled")[0])
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match=r"readout_loops=\[2, 3\]: timestep conditioning .* rescaled grid"):
        model.loop_readouts(ids, [2, 3])
    reason = model.readout_obstacle([2, 3])
    passes = sweep_passes(model, [2, 3])
    assert not passes.one_pass and passes.reason == reason
    assert passes.line() == f"loop sweep: one pass per r for r = 2, 3 ({reason})"
    # a single r is its own trajectory: readouts equal the forward even here
    with torch.no_grad():
        assert torch.equal(model.loop_readouts(ids, [3])[3], model(ids, num_loops=3).logits)


def test_prefix_grid_rows_do_not_depend_on_r_and_stop_at_k():
    full = timestep_features(K, K, "prefix")
    for r in range(1, K + 1):
        assert torch.equal(timestep_features(r, K, "prefix"), full[:r])
    model = _model(timestep="adaln", timestep_grid="prefix")
    assert model.readout_obstacle([1, K]) is None
    assert model.readout_obstacle([1, K + 1]) == f"the prefix timestep grid has no step for r = {K + 1} > K = {K} (App. C.1)"
    assert model.readout_obstacle([1, K + 1], timestep_grid="rescaled").startswith("timestep conditioning (adaln)")


def test_sweep_passes_decisions():
    plain = _model()
    passes = sweep_passes(plain, [1, 2, 4])
    assert passes.one_pass and passes.record() == {
        "mode": "one-pass", "loops": [1, 2, 4], "reason": "the trajectory does not depend on r: no timestep conditioning"}
    assert passes.line() == ("loop sweep: one forward per batch at r = 4 reads out r = 1, 2, 4 (the trajectory does "
                             "not depend on r: no timestep conditioning)")
    assert sweep_passes(_model(timestep="branch_gating", timestep_grid="prefix"), [1, 4]).one_pass
    assert sweep_passes(plain, [1, 2], allowed=False).reason == "--per-r"
    assert sweep_passes(plain, [3]).reason == "a single loop count"
    plain.config.exit_criterion = "cosine"  # the adaptive sweep's setting: its own passes
    assert not sweep_passes(plain, [1, 2]).one_pass


@pytest.mark.parametrize("loops, num_loops, message", [
    ([2, 1], None, "expected a list of distinct loop counts from 1 to 1024 in increasing order"),
    ([0, 1], None, "expected a list of distinct loop counts from 1 to 1024 in increasing order"),
    ([1, 3], 2, "the forward runs to the largest readout"),
])
def test_bad_readout_loops_are_refused(loops, num_loops, message):
    with pytest.raises(ValueError, match=message):
        _model().model(input_ids=torch.zeros(1, 3, dtype=torch.long), readout_loops=loops, num_loops=num_loops)
