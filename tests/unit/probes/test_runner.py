"""Probes on a real tiny LoopLM: hook placement, the telescoping identity, computational
interaction, batching invariance, the sampling rules, and one pass for every loop count (bitwise the
per-L sweep) or one per L where the trajectory depends on L."""

from __future__ import annotations

import pytest
import torch
from probe_fixtures import conditioned_model, tiny_model, write_prefix

from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.model.compat import rope_freqs
from megatron_loop.model.conditioning import timestep_features
from megatron_loop.probes import metrics
from megatron_loop.probes.runner import GeometryProbe, ProbeSettings, probe_passes
from megatron_loop.probes.sampling import ProbeSample, load_probe_sample, select_positions
from megatron_loop.parallel.bootstrap import ensure_groups

SEQ = 13  # tokens per window: 12 prediction positions

@pytest.fixture(autouse=True, scope="module")
def megatron_groups():
    """megatron-core's own attention (the reference path, or blocks called with rotary angles) reads its
    process groups when it runs; the model is built without any (build_model creates none)."""
    ensure_groups()



def random_sample(num_sequences: int = 3, num_positions: int = 30, seed: int = 1) -> ProbeSample:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 2000, (num_sequences, SEQ), generator=g)
    return ProbeSample(tokens, select_positions(num_sequences, SEQ - 1, num_positions))


def run(model, sample, loops, **kw):
    return GeometryProbe(model, sample, ProbeSettings(loops=loops, progress=False, **kw)).run()


def test_selection_budget_and_last_positions():
    mask = select_positions(3, 8, 20)  # 8 + 8 + 4: the boundary sequence partially selected
    assert mask.sum(dim=1).tolist() == [8, 8, 4]
    assert ProbeSample(torch.zeros(3, 9, dtype=torch.long), mask).last_positions.tolist() == [7, 7, 3]
    sample = ProbeSample(torch.zeros(4, 9, dtype=torch.long), select_positions(4, 8, 9))
    assert (sample.num_sequences, sample.num_positions) == (2, 9)  # N counts nonempty sequences
    with pytest.raises(LoopDataError):
        select_positions(2, 8, 17)


def test_identical_positions_across_configurations(tmp_path):
    prefix = write_prefix(tmp_path)
    a = load_probe_sample(prefix, SEQ, num_sequences=4, num_positions=40, seed=3)
    b = load_probe_sample(prefix, SEQ, num_sequences=4, num_positions=40, seed=3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)
    assert a.num_positions == 40 and a.mask.sum(dim=1).tolist() == [12, 12, 12, 4]
    assert not torch.equal(load_probe_sample(prefix, SEQ, 4, 40, seed=4).tokens, a.tokens)
    # two configurations (different conditioning, depth, loop counts) report the same sample
    base = run(tiny_model(seed=0), a, [2], sources="none")
    other = run(tiny_model(prelude=1, coda=1, seed=5), b, [3, 5], sources="none")
    assert base["sampling"] == other["sampling"]
    assert base["sampling"]["num_positions"] == 40 and base["sampling"]["num_sequences"] == 4


def test_telescoping_identity_and_hook_placement():
    model, sample = tiny_model(prelude=1, coda=1), random_sample()
    report = run(model, sample, [3, 6], sources="none")
    r6 = report["loops"]["6"]
    tele = r6["amplification"]["telescoping"]
    assert tele["variance_ratio"] != pytest.approx(1.0, abs=1e-3)
    assert tele["product"] == pytest.approx(tele["variance_ratio"], rel=1e-10)
    assert r6["loop"]["normalized_state_variance"][6] == pytest.approx(tele["product"], rel=1e-10)
    assert r6["loop"]["normalized_state_variance"][3] == 1.0
    # independent recomputation of x^(t), z^(t), y^(t) from the model's own modules
    mask = sample.mask
    with torch.no_grad():
        out = model(sample.inputs, num_loops=6, return_trajectory=True, compute_logits=False)
        xs = [x.transpose(0, 1) for x in out.trajectory]  # [s, b, d]
        rope = rope_freqs(model.rope_inv_freq, sample.inputs.shape[1], sample.inputs.device)
        psi = timestep_features(6, 3, "rescaled")
        for step in range(6):
            z = model.initial_injection(xs[step], xs[0])
            y = model.core[1](model.core[0](z, rope, psi[step]), rope, psi[step])
            assert torch.allclose(model.loop_gating(xs[step], y, psi[step]), xs[step + 1], atol=1e-5)
            sel = lambda h: h.transpose(0, 1)[mask]  # noqa: E731
            amp = r6["amplification"]
            assert amp["injected_variance"][step] == pytest.approx(metrics.state_variance(sel(z)), rel=1e-5)
            assert amp["core_output_variance"][step] == pytest.approx(metrics.state_variance(sel(y)), rel=1e-5)
            assert r6["loop"]["state_variance"][step] == pytest.approx(metrics.state_variance(sel(xs[step])), rel=1e-6)
            assert amp["g_inj"][step] != pytest.approx(1.0, abs=1e-4)  # injection is active
            assert amp["g_mix"][step] != pytest.approx(1.0, abs=1e-4)  # loop gating is active
    last = sample.last_positions
    at_last = lambda h: h[torch.arange(h.shape[0]), last]  # noqa: E731
    expected = metrics.mean_angular_distance(at_last(out.trajectory[2]), at_last(out.trajectory[3]))
    assert r6["loop"]["angle"][2] == pytest.approx(expected, rel=1e-6)
    assert r6["segments"] == ["prelude"] + ["core"] * 12 + ["coda"]


def test_under_unrolled_variance_uses_training_run_reference():
    report = run(tiny_model(), random_sample(), [1], sources="none")
    assert report["reference_loops_added"] == [3]
    ref = report["loops"]["3"]["loop"]["state_variance"][3]
    one = report["loops"]["1"]["loop"]
    assert one["variance_reference"] == ref
    assert one["normalized_state_variance"] == pytest.approx([v / ref for v in one["state_variance"]])


def _reference_interaction(model, sample, loops, source, target):
    """N, B, C of one pair from two plain runs with a hook written here (not the runner's)."""
    records = []

    def hook_factory(skip):
        def hook(module, args, output):  # one hook shared by all blocks: calls are occurrences
            if len(records) + 1 == skip:
                output = args[0]
            records.append((args[0], output))
            return output
        return hook

    updates = []
    for skip in (0, source):
        records.clear()
        hook = hook_factory(skip)
        handles = [b.register_forward_hook(hook) for b in [*model.prelude, *model.core, *model.coda]]
        with torch.no_grad():
            model(sample.inputs, num_loops=loops, compute_logits=False)
        for h in handles:
            h.remove()
        h_in, h_out = records[target - 1]
        updates.append((h_out - h_in).transpose(0, 1)[sample.mask])
    return metrics.interaction_from_updates(updates[0], updates[1])


def test_interaction_matches_reference_and_is_batch_invariant():
    model, sample = tiny_model(prelude=1, coda=1), random_sample(num_sequences=2, num_positions=20)
    a = run(model, sample, [5], batch_size=1, skip_batch=3)["loops"]["5"]["interaction"]
    b = run(model, sample, [5], batch_size=2, skip_batch=11)["loops"]["5"]["interaction"]
    for i in range(1, 12):
        for j in range(i + 1, 13):
            assert a["C"][i - 1][j - 1] == pytest.approx(b["C"][i - 1][j - 1], rel=1e-6, abs=1e-12)
    for source, target in [(1, 2), (4, 9), (8, 12)]:
        n, bj, c = _reference_interaction(model, sample, 5, source, target)
        assert a["N"][source - 1][target - 1] == pytest.approx(n, rel=1e-5)
        assert a["B"][target - 1] == pytest.approx(bj, rel=1e-6)
        assert a["C"][source - 1][target - 1] == pytest.approx(c, rel=1e-5)
    assert a["C"][5][2] is None  # j <= i is not a pair
    by_lag = a["by_lag"]  # 1 + 2x5 + 1, L_tr = 3: loops 4, 5 -> |P_0| = 2, |P_1| = 4
    assert by_lag["lags"] == [0, 1] and by_lag["pairs"] == [2, 4]


def test_interaction_zero_for_zero_update_source_positive_otherwise():
    model, sample = tiny_model(prelude=1, coda=1), random_sample()
    with torch.no_grad():  # the prelude block's update becomes exactly zero
        model.prelude[0].self_attention.linear_proj.weight.zero_()
        model.prelude[0].mlp.linear_fc2.weight.zero_()
    inter = run(model, sample, [4], batch_size=3, skip_batch=9)["loops"]["4"]["interaction"]
    depth = 1 + 2 * 4 + 1
    assert inter["B"][0] == 0.0
    assert all(inter["C"][0][j] == 0.0 and inter["N"][0][j] == 0.0 for j in range(1, depth))
    assert all(inter["C"][i][j] > 0 for i in range(1, depth - 1) for j in range(i + 1, depth))


def test_blocks_compiled_in_place_are_probed_eagerly():
    sample = random_sample(num_sequences=1, num_positions=12)
    compiled = tiny_model(compile=True)  # nn.Module.compile is lazy: the probe never triggers it
    eager = run(tiny_model(), sample, [3], sources="none")["loops"]["3"]
    probed = run(compiled, sample, [3], sources="none")["loops"]["3"]
    assert probed["block"] == eager["block"] and probed["loop"] == eager["loop"]
    assert all(block._compiled_call_impl is not None for block in compiled.core)  # restored


# ---------------------------------------------------------------------- one pass for every loop count
def block_calls(model, fn):
    """How many block forwards ``fn`` runs (every prelude, core and coda call)."""
    calls = []
    handles = [b.register_forward_hook(lambda *a: calls.append(1)) for b in model.blocks()]
    try:
        fn()
    finally:
        for h in handles:
            h.remove()
    return len(calls)


@pytest.mark.parametrize("conditioning,loops,why", [
    (dict(), [1, 2, 4], "no timestep conditioning"),
    (dict(initial_injection="scalar", history_injection="scalar", history_window=2), [2, 4],
     "no timestep conditioning"),
    (dict(initial_injection="scalar", timestep="loop_gating", timestep_grid="prefix"), [1, 3],
     "timestep conditioning (loop_gating) on the prefix grid, r <= K = 3"),
    (dict(history_injection="scalar", timestep="adaln", timestep_grid="prefix"), [2, 3],
     "timestep conditioning (adaln) on the prefix grid, r <= K = 3"),
    (dict(timestep="branch_gating", timestep_grid="prefix"), [1, 2], "timestep conditioning (branch_gating)"),
    (dict(timestep="shortcut", timestep_grid="prefix"), [1, 2, 3], "timestep conditioning (shortcut)"),  # LoopFormer
    (dict(block_norm="sandwich", norm_core_output=True), [1, 4], "no timestep conditioning"),  # Coda reads Norm(h^r)
])
def test_one_pass_report_is_bitwise_the_per_loop_sweep(conditioning, loops, why):
    """Where the trajectory does not depend on L, every metric (block terms of the prelude, loop and Coda
    occurrences, loop terms, N/B/C of every skip) equals one pass per L exactly, for other skip groupings."""
    model, sample = conditioned_model(**conditioning), random_sample()
    told = []
    per_r = run(model, sample, loops, one_pass=False)
    one = GeometryProbe(model, sample, ProbeSettings(loops=loops, progress=False, skip_batch=3)).run(told.append)
    assert one.pop("sweep_passes") == {"mode": "one-pass", "loops": sorted({*loops, 3}),
                                       "reason": told[0].reason}
    assert told[0].one_pass and why in told[0].line()
    assert per_r.pop("sweep_passes")["mode"] == "per-r"
    assert one == per_r
    assert one["loops"][str(max(loops))]["interaction"]["N"][0][-1] > 0  # Coda targets were measured


def test_one_pass_runs_the_forward_once_and_each_coda_readout():
    """Without skip runs a chunk costs D(L_max) + c (n - 1) block calls, not the sum of D(L)."""
    model, sample = conditioned_model(), random_sample(num_sequences=2, num_positions=24)
    loops, depth = [1, 2, 4], lambda L: 1 + 2 * L + 2  # noqa: E731
    one = block_calls(model, lambda: run(model, sample, loops, sources="none"))
    per_r = block_calls(model, lambda: run(model, sample, loops, sources="none", one_pass=False))
    assert (one, per_r) == (2 * (depth(4) + 2 * 3), 2 * sum(depth(L) for L in [1, 2, 3, 4]))


def test_r_dependent_trajectory_falls_back_to_one_pass_per_loop_count():
    """The rescaled grid (t_l = l / L) and the prefix grid beyond K: one pass per L, saying why."""
    told = []
    report = GeometryProbe(tiny_model(), random_sample(), ProbeSettings(loops=[2, 4], progress=False,
                                                                        sources="none")).run(told.append)
    assert report["sweep_passes"]["mode"] == "per-r" and not told[0].one_pass
    assert "rescaled grid: t_l = l/r and dt = 1/r depend on r" in told[0].line()
    assert "one pass per r for r = 2, 3, 4" in told[0].line()
    prefix = conditioned_model(timestep="adaln", timestep_grid="prefix")
    passes = probe_passes(prefix, [2, 5])
    assert not passes.one_pass and "no step for r = 5 > K = 3" in passes.reason
    assert probe_passes(prefix, [2, 3], allowed=False).reason == "--per-r"


def test_one_pass_refuses_a_coda_that_reads_something_else():
    """The Coda readouts feed the Coda ``coda_input(x^(L))``; a forward that feeds it anything else is
    refused rather than read out wrongly at the smaller L."""
    model = conditioned_model()
    model.coda[0].register_forward_pre_hook(lambda module, args: (2 * args[0], *args[1:]))
    with pytest.raises(LoopConfigError, match=r"the Coda's input at r = 3 is not LoopLM.coda_input\(h\^r\)"):
        run(model, random_sample(), [1, 3], sources="none")
