"""Ranks that disagree on the config do not train (docs/RELIABILITY.md row 66; issue 44 case 1).

Before: one rank given an edited YAML (lr, ``seq_length``, the ZeRO stage, ``train_loops``) and both
ranks exited 0 "training finished" (ZeRO-1 on rank 0 and ZeRO-2 on rank 1 published as "stage 1");
a ``core_layers`` difference crashed rank 1 with SIGABRT inside gloo. Now every rank compares its
resolved config, DeepSpeed JSON, data and tokenizer with rank 0's right after the world is formed
and the job stops with one line naming the first key that differs and the ranks."""

from __future__ import annotations

import subprocess
import time

import pytest

from megatron_loop.config import config_from_dict
from megatron_loop.errors import LoopConfigError
from megatron_loop.training import agreement
from megatron_loop.training.distributed import DistInfo
from train_fixtures import FAULTS, REPO, command, env, reference_run

BOUND_S = 180


def test_the_first_differing_key_and_the_ranks_are_named(monkeypatch):
    """Rank 1's view of a 3-rank job whose ranks 1 and 2 run another ``model.core_layers`` (rank 2 also
    another lr): the one line every rank prints."""
    base = {"model": {"backbone": "tiny-llama", "core_layers": 2}, "train": {"lr": 3e-3}}
    rank0 = agreement.run_fingerprint(config_from_dict(base), None)
    ranks = [rank0, agreement.run_fingerprint(config_from_dict({**base, "model": {"backbone": "tiny-llama",
                                                                                  "core_layers": 3}}), None),
             agreement.run_fingerprint(config_from_dict({"model": {"backbone": "tiny-llama", "core_layers": 4},
                                                         "train": {"lr": 1e-3}}), None)]
    monkeypatch.setattr(agreement.D, "broadcast_object", lambda obj: rank0)
    monkeypatch.setattr(agreement.D, "all_gather_object", lambda _: [
        None if (d := agreement.first_difference(rank0, mine)) is None else (d[0], agreement._show(d[1]))
        for mine in ranks])
    assert agreement.first_difference(rank0, rank0) is None
    with pytest.raises(LoopConfigError) as e:
        agreement.check_ranks_agree(config_from_dict(base), None, DistInfo(1, 3, 1))
    assert str(e.value) == ("the ranks run different settings: model.core_layers=2 on rank 0, 3 on rank 1; 4 on rank 2; "
                            "expected every rank to run the same config, DeepSpeed JSON, data and tokenizer (the same "
                            "YAML, --set overrides and files on every node)")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_a_rank_with_another_zero_stage_stops_the_job_with_one_line(tmp_path):
    """torchrun, 2 gloo ranks; rank 1 runs ``deepspeed_configs/zero2.json`` (the issue's ZeRO-1/ZeRO-2 job
    that published a "stage 1" checkpoint). Both ranks stop before the run folder exists."""
    run = tmp_path / "run"
    args = ["--config", str(reference_run().config), "--set", f"train.output_dir={run}"]
    start = time.monotonic()
    result = subprocess.run(command("config@1:train.deepspeed_config=deepspeed_configs/zero2.json", *args, nproc=2,
                                    launcher="torchrun", script=str(FAULTS)),
                            cwd=REPO, env=dict(env(), TORCH_ELASTIC_SHUTDOWN_TIMEOUT="10"), capture_output=True,
                            text=True, timeout=BOUND_S)
    out = result.stdout + result.stderr
    assert time.monotonic() - start < BOUND_S
    assert result.returncode != 0 and "exitcode: 2" in out, out[-4000:]
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: the ranks run different settings: train.deepspeed_config="
                      f"\"{REPO / 'deepspeed_configs/zero1.json'}\" on rank 0, \"{REPO / 'deepspeed_configs/zero2.json'}\" "
                      "on rank 1; expected every rank to run the same config, DeepSpeed JSON, data and tokenizer (the "
                      "same YAML, --set overrides and files on every node)"], out[-4000:]
    # the only traceback is torchrun's own report of a failed rank (its ChildFailedError), none of a rank
    assert all("bin/torchrun" in tail[:200] for tail in out.split("Traceback")[1:]), out[-4000:]
    assert not run.exists()
