"""One-pass loop sweeps end to end on exported LoopLMs: lm-eval's log-likelihood answers and the held-out
loss of every r from one forward per batch are bitwise those of one pass per r (so the scores are
identical), on a model without timestep conditioning and on one with AdaLN on the prefix grid; the
sweep says which it did (results.json ``sweep_passes``) and falls back to one pass per r on the
rescaled grid."""

from __future__ import annotations

import json
import shutil

import pytest

from data_fixtures import data_assets
from eval_fixtures import write_local_tasks
from hf_fixtures import hf_assets

pytestmark = [pytest.mark.deps, pytest.mark.slow]

LOOPS = [1, 2, 4]


def _settings(tasks, include, one_pass: bool, loops=LOOPS, **kw):
    from megatron_loop.eval.sweep import SweepSettings

    return SweepSettings(loops=list(loops), tasks=tasks, limit=4, include_paths=include,
                         valid_prefix=data_assets().prefix + "_valid", seq_length=32, valid_sequences=5,
                         batch_size=3, progress=False, one_pass=one_pass, **kw)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """One loaded export (0+2x3+0, no timestep conditioning) with two local tasks, shared by the sweeps."""
    from megatron_loop.eval.sweep import open_session
    from megatron_loop.eval.tasks import resolve_tasks

    folder = tmp_path_factory.mktemp("tasks")
    local = write_local_tasks(folder)
    tasks = resolve_tasks([f"clutrr={local['clutrr']}", "piqa=looplm_tracking_local"])
    include = [str(folder), str(data_assets().corpus / "eval")]
    return open_session(hf_assets().exports["base_llama"], _settings(tasks, include, True)), tasks, include


def _comparable(results: dict) -> dict:
    return {k: v for k, v in results.items() if k != "sweep_passes"}


def test_one_pass_sweep_equals_the_per_r_sweep(session):
    from megatron_loop.eval.sweep import run_sweep

    sess, tasks, include = session
    lines = []
    one = run_sweep(sess, _settings(tasks, include, True), on_passes=lambda p: lines.append(p.line()))
    per_r = run_sweep(sess, _settings(tasks, include, False), on_passes=lambda p: lines.append(p.line()))
    assert one["sweep_passes"] == [{"mode": "one-pass", "loops": LOOPS,
                                    "reason": "the trajectory does not depend on r: no timestep conditioning"}]
    assert per_r["sweep_passes"] == [{"mode": "per-r", "loops": LOOPS, "reason": "--per-r"}]
    assert lines[0].startswith("loop sweep: one forward per batch at r = 4 reads out r = 1, 2, 4")
    assert _comparable(one) == _comparable(per_r)  # every score, stderr, stratum and held-out loss, exactly
    assert len({one["heldout"][r]["loss"] for r in LOOPS}) == 3  # the r really differ
    assert sess.model.config.num_loops == 3  # back at K


def test_served_loglikelihoods_are_bitwise_those_of_each_r(session):
    """lm-eval's answers (log-likelihood, greedy) of one-pass serving against HFLM at each r, over requests
    that share contexts (one-token continuations: HFLM's grouped batches), span several batches and
    differ in length; with and without HFLM's logits cache (grouping)."""
    from megatron_loop.eval.sweep import set_loops

    lm = session[0].lm
    ctx = [[5, 9, 13, 2], [7, 7, 1], [3, 4, 5, 6, 7, 8, 9, 10, 11], [12, 30]]
    requests = [(("", ""), c, cont) for c in ctx for cont in ([4], [8], [4, 6, 1], [21, 3])]
    requests += [(("", ""), ctx[0], [4])]  # a duplicate
    for cache in (True, False):
        lm.logits_cache = cache
        expected = {}
        for r in LOOPS:
            set_loops(lm.model, r)
            expected[r] = lm._loglikelihood_tokens(requests)
        with lm.one_pass(LOOPS):
            for r in LOOPS:
                set_loops(lm.model, r)
                assert lm._loglikelihood_tokens(requests) == expected[r], (cache, r)
        assert expected[1] != expected[4]
    lm.logits_cache = True


def test_prefix_grid_is_one_pass_and_the_rescaled_grid_falls_back(tmp_path):
    """AdaLN (K = 3) exported with the prefix grid: one forward serves r = 1..3, bitwise; on the rescaled
    grid (t_l = l/r) the same sweep runs one pass per r and says why."""
    from megatron_loop.eval.sweep import open_session, run_sweep

    folder = tmp_path / "adaln"
    shutil.copytree(hf_assets().exports["base_qwen_dense"], folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["timestep"] == "adaln" and config["train_loops"] == 3
    (folder / "config.json").write_text(json.dumps({**config, "timestep_grid": "prefix"}))
    loops = [1, 2, 3]
    sess = open_session(folder, _settings([], [], True, loops))
    one = run_sweep(sess, _settings([], [], True, loops))
    per_r = run_sweep(sess, _settings([], [], False, loops))
    assert one["sweep_passes"][0]["mode"] == "one-pass" and "prefix grid" in one["sweep_passes"][0]["reason"]
    assert one["heldout"] == per_r["heldout"]

    sess.model.config.timestep_grid = "rescaled"
    fallback = run_sweep(sess, _settings([], [], True, loops))
    assert fallback["sweep_passes"][0]["mode"] == "per-r"
    assert fallback["sweep_passes"][0]["reason"].startswith("timestep conditioning (adaln) on the rescaled grid")
    assert fallback["heldout"][1] != one["heldout"][1]  # a different grid, a different model at r < K
