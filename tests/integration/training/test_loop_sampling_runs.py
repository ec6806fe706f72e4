"""Sampled loop counts in training runs: ``train.loop_sampling`` (the draws themselves:
tests/unit/training/test_loop_sampling.py).

Each micro-batch draws its own k (Huginn's draw per micro-batch, the default ``loop_sampling_per: micro_batch``),
both of 2 gloo ranks run the same k for the same micro-batch (lockstep, as Huginn's released run), a resumed
run continues with the very draws of the remaining steps, and metrics.jsonl records them. The paper's setting spelled through the new code paths (a degenerate uniform range
k = K, backprop_loops = K) reproduces the default run bit for bit. (The default run itself was
checked against the code before this change: identical losses, gradient norms, validation losses
and final weights on the tiny run.)
"""

from __future__ import annotations

import pytest

import json

from megatron_loop.config import config_from_dict
from megatron_loop.model.initial_state import step_seed
from megatron_loop.training.loop_sampling import sample_train_loops
from testpaths import TRAIN_SCRIPTS
from train_fixtures import (assert_same_weights, check_ok, final_weights, losses, records, reference_run, run_cli,
                            tiny_config)

pytestmark = pytest.mark.slow

RECORD = str(TRAIN_SCRIPTS / "record_loops.py")


def test_paper_setting_through_the_new_paths_is_the_default_run_bit_for_bit(tmp_path):
    """k drawn from the range {K} with backprop_loops = K: every new code path taken, nothing changed."""
    ref = reference_run()
    run = tmp_path / "run"
    check_ok(run_cli("--config", str(ref.config), "--set", f"train.output_dir={run}",
                     "--set", "train.loop_sampling=uniform", "--set", "train.loop_sampling_min=2",
                     "--set", "train.loop_sampling_max=2", "--set", "train.backprop_loops=2"))
    assert losses(run) == losses(ref.run_dir)
    assert records(run, "eval") == records(ref.run_dir, "eval")
    assert_same_weights(final_weights(ref.run_dir), final_weights(run))
    assert [r["train_loops"] for r in records(ref.run_dir, "train")] == [2] * 10


@pytest.mark.distributed
def test_sampled_loops_differ_per_micro_batch_equal_on_every_rank_and_across_resume(tmp_path):
    """2 gloo ranks, 2 micro-batches per rank and step; stopped after step 2 (exit_interval) and
    resumed to step 4: every training forward of both ranks ran the draw of its micro-batch (Huginn's
    train.py:397-398 draws per micro-batch; its released run in lockstep across ranks), so the depths of
    one update differ. The model is
    Huginn's (sandwich blocks, the state drawn from noise, model/initial_state.py), trained in bf16 through
    DeepSpeed's engine (the precision users run on GPU): each micro-batch's
    noise seed is step_seed(train.seed, step, micro-batch, rank), so the resumed run redraws the noise
    of the remaining steps exactly, with nothing in the checkpoint."""
    steps, k = 4, 3
    huginn = {"initial_injection": "dense", "initial_state": "noise", "block_norm": "sandwich",
              "norm_core_output": True}
    config = tiny_config(tmp_path, model={"train_loops": k, **huginn},
                         train={"max_steps": steps, "save_interval": 100, "eval_interval": 0, "precision": "bf16",
                                "loop_sampling": "poisson_lognormal", "backprop_loops": 1})
    rec = tmp_path / "calls"
    common = (str(rec), "--config", str(config))
    check_ok(run_cli(*common, "--set", "train.exit_interval=2", nproc=2, launcher="torchrun", script=RECORD))
    resumed = run_cli(*common, nproc=2, launcher="torchrun", script=RECORD)
    check_ok(resumed)
    assert "resuming from" in resumed.stdout + resumed.stderr
    assert "precision bf16" in resumed.stdout + resumed.stderr

    cfg = config_from_dict({"model": {"backbone": "tiny-llama", "train_loops": k, **huginn},
                            "train": {"loop_sampling": "poisson_lognormal", "backprop_loops": 1}})
    accumulation = 2  # global 8 = micro 2 x 2 micro-batches x 2 ranks
    expected = [[sample_train_loops(cfg.train, k, s, m) for m in range(accumulation)] for s in range(steps)]
    assert any(len(set(update)) > 1 for update in expected), expected  # depths differ within an update
    per_rank = [[json.loads(line) for line in (tmp_path / f"calls.rank{r}.jsonl").read_text().splitlines()]
                for r in (0, 1)]
    assert [c[:3] for c in per_rank[0]] == [c[:3] for c in per_rank[1]]  # lockstep: the same depths on both ranks
    assert [c[0] for c in per_rank[0]] == [n for update in expected for n in update]
    for num_loops, backprop, grid, _ in per_rank[0]:
        assert backprop == 1 and grid == (None if num_loops == k else "rescaled")  # psi on the grid of the draw
    for rank in (0, 1):  # Huginn's noise: a pure function of (seed, step, micro-batch, rank), across the resume
        assert [c[3] for c in per_rank[rank]] == [step_seed(42, s, m, rank) for s in range(steps)
                                                  for m in range(accumulation)]
    run = tmp_path / "run"
    assert [r["micro_batch_loops"] for r in records(run, "train")] == expected
    assert [r["train_loops"] for r in records(run, "train")] == [sum(u) / len(u) if len(set(u)) > 1 else u[0]
                                                               for u in expected]
    assert [r["step"] for r in records(run, "resume")] == [2]
