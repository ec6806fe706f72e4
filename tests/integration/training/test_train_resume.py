"""Exact resume with 2 gloo ranks: stop after N steps, resume to
2N, and the loss trajectory, the validation losses and the final weights equal an uninterrupted
2N run bitwise (CPU fp32), data order included.

* ZeRO 1 under ``torchrun``: every rank is killed with SIGKILL at an arbitrary step after the
  checkpoint of step N (a crash: nothing is flushed or saved on the way out);
* ZeRO 3 under the ``deepspeed`` launcher: a planned stop at step N (``train.exit_interval``,
  which keeps the 2N-step schedule).
The second run resumes automatically from the run folder.
"""

from __future__ import annotations

import pytest

from train_fixtures import (FAULTS, assert_same_weights, check_ok, final_weights, kill_all_ranks, losses, records,
                            run_cli, start_cli, tiny_config, wait_for_step)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

N = 3


def _stop_after_n(common, split, stage, launcher):
    if stage == 1:  # crash of all ranks
        proc = start_cli("slow@0.3", *common, "--set", f"train.output_dir={split}", "--set", f"train.save_interval={N}",
                         nproc=2, launcher=launcher, script=str(FAULTS))
        wait_for_step(proc, split, N + 1)  # the checkpoint of step N is published before step N + 1 runs
        kill_all_ranks(proc)
        assert proc.returncode != 0
    else:  # planned stop
        check_ok(run_cli(*common, "--set", f"train.output_dir={split}", "--set", f"train.exit_interval={N}",
                         nproc=2, launcher=launcher))
        assert sorted(losses(split)) == list(range(1, N + 1))
    assert (split / "checkpoints" / "latest").read_text() == f"global_step{N}"


@pytest.mark.parametrize("stage,launcher", [(1, "torchrun"), (3, "deepspeed")])
def test_exact_resume_two_ranks(tmp_path, stage, launcher):
    config = tiny_config(tmp_path, train={"max_steps": 2 * N, "save_interval": 100, "eval_interval": N,
                                          "deepspeed_config": f"deepspeed_configs/zero{stage}.json"})
    full, split = tmp_path / "full", tmp_path / "split"
    common = ("--config", str(config))
    check_ok(run_cli(*common, "--set", f"train.output_dir={full}", nproc=2, launcher=launcher))
    _stop_after_n(common, split, stage, launcher)
    resumed = run_cli(*common, "--set", f"train.output_dir={split}", nproc=2, launcher=launcher)
    check_ok(resumed)
    assert f"resuming from {split / 'checkpoints' / f'global_step{N}'} (step {N}" in resumed.stdout + resumed.stderr

    reference = losses(full)
    assert sorted(reference) == list(range(1, 2 * N + 1))
    assert losses(split) == reference  # bitwise: floats compare exactly; replayed steps not duplicated
    assert records(split, "resume")[-1]["step"] == N
    assert records(split, "eval") == records(full, "eval")  # validation at r = 1, 2, 4, bitwise too
    assert_same_weights(final_weights(full), final_weights(split))
