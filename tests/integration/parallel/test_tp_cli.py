"""``pretrain_loop.py`` at TP = 2 (torchrun, 2 gloo ranks): exact resume and the TP-size guard.

The tiny run of ``train_fixtures.tiny_config`` with ``parallel.tensor_model_parallel_size=2`` and
sequence parallelism (ZeRO 1, fp32, Muon+AdamW, accumulation 4): an uninterrupted 6-step run, and
a run stopped at step 3 (``train.exit_interval``, the 6-step schedule kept) then resumed from its
checkpoint, give the same losses and validation losses bit for bit and the same final weights
(read back through the TP merge of ``checkpoint.weights``). Resuming that TP = 2 checkpoint in one process
(TP = 1) stops with one ``error:`` line before DeepSpeed reads it.
"""

from __future__ import annotations

import pytest

from train_fixtures import assert_same_weights, check_ok, final_weights, losses, records, run_cli, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

N = 3
TP2 = ("--set", "parallel.tensor_model_parallel_size=2", "--set", "parallel.sequence_parallel=true")


def test_tp2_run_resumes_exactly_and_refuses_another_tp_size(tmp_path):
    config = tiny_config(tmp_path, train={"max_steps": 2 * N, "save_interval": 100, "eval_interval": N})
    full, split = tmp_path / "full", tmp_path / "split"
    common = ("--config", str(config), *TP2)
    check_ok(run_cli(*common, "--set", f"train.output_dir={full}", nproc=2, launcher="torchrun"))
    check_ok(run_cli(*common, "--set", f"train.output_dir={split}", "--set", f"train.exit_interval={N}",
                     nproc=2, launcher="torchrun"))
    assert (split / "checkpoints" / "latest").read_text() == f"global_step{N}"

    refused = run_cli("--config", str(config), "--set", f"train.output_dir={split}")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        f"error: {split / 'checkpoints' / f'global_step{N}' / 'manifest.json'}: written with "
        "parallel.tensor_model_parallel_size=2, resumed with 1; the per-rank files hold tensor-parallel slices of "
        "that size: resume with --set parallel.tensor_model_parallel_size=2 (tools/convert_to_hf.py exports the "
        "weights at any TP)")

    resumed = run_cli(*common, "--set", f"train.output_dir={split}", nproc=2, launcher="torchrun")
    check_ok(resumed)
    reference = losses(full)
    assert sorted(reference) == list(range(1, 2 * N + 1))
    assert losses(split) == reference  # bitwise
    assert records(split, "eval") == records(full, "eval")
    assert_same_weights(final_weights(full), final_weights(split))
