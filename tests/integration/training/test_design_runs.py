"""The peer designs' training objectives through the real DeepSpeed engine in bf16 on CPU, each stopped after
step 2 (``train.exit_interval``) and resumed to step 4: losses, validation losses and final weights bitwise
equal to the uninterrupted run, and the design's own parameters trained.

* Ouro (``model.exit_gate: learned``, Stage I objective, ``model/exit_gate.py``): ZeRO 1 on one rank with
  sampled loop counts (Stage I over several T = r).
* LoopFormer (``model.timestep: shortcut`` + ``train.shortcut_consistency``, ``model/shortcut.py``): ZeRO 3 on
  2 gloo ranks; the ranks run the same short trajectories (ZeRO 3's per-block gathers need the same loops on
  every rank), every micro-batch's short trajectory is redrawn from (seed, step, micro-batch), and the loop
  dynamics read their gates from gathered weights.

Huginn's noise state and sampled depths resume in tests/integration/training/test_loop_sampling_runs.py.
The objectives' numbers themselves: tests/unit/model/test_exit_gate.py, test_shortcut.py."""

from __future__ import annotations

import pytest

from megatron_loop.model.shortcut import sample_short_trajectory
from train_fixtures import (assert_same_weights, check_ok, final_weights, launch_all, losses, records, run_cli,
                            tiny_config)

pytestmark = [pytest.mark.slow, pytest.mark.distributed]  # LoopFormer: 2 gloo ranks

STEPS, K, SEED = 4, 3, 42
DESIGNS = {
    "ouro": dict(ranks=1, model={"exit_gate": "learned"},
                 train={"exit_gate_objective": "entropy_regularized", "loop_sampling": "uniform",
                        "loop_sampling_min": 1, "loop_sampling_max": 3},
                 engine="BF16_Optimizer", trained=("exit_gate.bias",)),
    "loopformer": dict(ranks=2, model={"train_loops": K, "timestep": "shortcut"},
                       train={"shortcut_consistency": True, "deepspeed_config": "deepspeed_configs/zero3.json"},
                       engine="ZeRO 3, precision bf16",
                       # the (t, dt) embedders' last biases start at 0: trained through every loop's modulation
                       trained=("shortcut_embedding.step_embedder.2.bias", "core.0.attn_adaln.bias")),
}


@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_design_objective_in_bf16_trains_and_resumes_exactly(tmp_path, design):
    spec = DESIGNS[design]
    config = tiny_config(tmp_path, model=spec["model"],
                         train={"max_steps": STEPS, "save_interval": 100, "eval_interval": 2, "precision": "bf16",
                                "seed": SEED, **spec["train"]},
                         logging={"dynamics_interval": 2})
    full, split = tmp_path / "full", tmp_path / "split"
    common = ["pretrain_loop.py", "--config", str(config)]
    launch_all(tmp_path, {"full": (spec["ranks"], [*common, "--set", f"train.output_dir={full}"]),
                          "split": (spec["ranks"], [*common, "--set", f"train.output_dir={split}", "--set",
                                                    "train.exit_interval=2"])})
    assert sorted(losses(split)) == [1, 2]
    launch = dict(nproc=2, launcher="torchrun") if spec["ranks"] == 2 else {}
    resumed = run_cli(*common[1:], "--set", f"train.output_dir={split}", **launch)
    check_ok(resumed)
    assert "resuming from" in resumed.stdout + resumed.stderr
    assert spec["engine"] in (tmp_path / "full.log").read_text()
    assert losses(split) == losses(full)  # bitwise
    assert records(split, "eval") == records(full, "eval")
    weights = final_weights(full)
    assert_same_weights(weights, final_weights(split))
    for name in spec["trained"]:
        assert weights[name].abs().sum().item() > 0
    if design == "ouro":
        assert len({r["train_loops"] for r in records(full, "train")}) > 1  # Stage I over several T = r
    else:
        accumulation = 2  # global 8 = micro 2 x 2 micro-batches x 2 ranks: a short trajectory each
        assert len({sample_short_trajectory(K, SEED, s, m) for s in range(STEPS) for m in range(accumulation)}) > 1
        dynamics = records(full, "dynamics")
        assert dynamics and all(f"adaln_scale_attn_l{l}" in dynamics[0] for l in range(1, K + 1))
