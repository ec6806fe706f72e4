"""The training loop end to end on CPU (App. C.2).

One single-process run of the tiny 2x2 LoopLM on the bundled corpus (``reference_run``) is the
subject of most checks: the loss falls, every metric is logged, validation runs per r, the
schedule ends at 0.1 x peak, checkpoints are written atomically, pruned to ``keep_last`` and
loadable by ``load_model_from_checkpoint``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from train_fixtures import records, reference_run

pytestmark = pytest.mark.slow

TRAIN_FIELDS = {"step", "consumed_samples", "tokens", "loss", "grad_norm", "lr_muon", "lr_adamw",
                "tokens_per_s", "mfu", "step_time_s", "mem_gib", "mem_peak_gib", "update_applied",
                "skipped_updates"}


def test_loss_falls_on_the_bundled_corpus():
    run = reference_run().run_dir
    losses = [r["loss"] for r in records(run, "train")]
    assert len(losses) == 10
    assert losses[0] > 6.0  # about ln(640): an untrained model
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    evals = records(run, "eval")
    assert [e["step"] for e in evals] == [5, 10]
    assert evals[1]["val_loss_r2"] < evals[0]["val_loss_r2"]


def test_loop_dynamics_are_logged_on_the_held_out_batch():
    """training/dynamics.py inside a run: every logging.dynamics_interval steps, K = 2, every rank's
    numbers (the unit test checks them against the model's forward), and one console line each."""
    run = reference_run()
    dynamics = records(run.run_dir, "dynamics")
    assert [d["step"] for d in dynamics] == [5, 10]
    expected = ({f"state_norm_l{l}" for l in range(4)} | {f"relative_update_l{l}" for l in (1, 2, 3)}
                | {f"batch_loss_r{r}" for r in (1, 2, 3)} | {"event", "step"})
    assert all(d.keys() == expected and all(math.isfinite(d[k]) for k in expected - {"event"}) for d in dynamics)
    assert dynamics[1]["batch_loss_r2"] < dynamics[0]["batch_loss_r2"]  # training lowered the loss at r = K
    lines = [line for line in run.result.stderr.splitlines() if line.startswith("loop dynamics at step")]
    assert len(lines) == 2 and lines[0].startswith("loop dynamics at step 5 | loss r=1 "), lines


def test_resolved_config_is_written_to_the_run_folder_with_one_line_saying_where():
    run = reference_run()
    out = run.result.stderr  # with the step lines: one stream for the run's log
    lines = [line for line in out.splitlines() if line.startswith("resolved config")]
    path = run.run_dir / "resolved_config.json"
    assert lines == [f"resolved config: {path} ({run.config} + --set overrides + backbone preset + defaults)"]
    assert '"model": {' not in out and "resolved config" not in run.result.stdout  # the JSON is not in the log
    written = json.loads(path.read_text())
    assert written["model"]["backbone"] == "tiny-llama" and written["model"]["hidden_size"] == 64  # preset filled in
    assert written["train"]["eval_loops"]  # defaults resolved


def test_metrics_file_has_every_field():
    run = reference_run().run_dir
    train = records(run, "train")
    for r in train:
        assert TRAIN_FIELDS <= r.keys(), TRAIN_FIELDS - r.keys()
        assert all(math.isfinite(r[k]) for k in ("loss", "grad_norm", "tokens_per_s", "mem_gib"))
        assert r["tokens_per_s"] > 0 and r["mem_peak_gib"] > 0
        assert r["mfu"] is None  # CPU without logging.peak_tflops: no known peak, no MFU
        assert r["lr_muon"] == r["lr_adamw"]  # one peak learning rate, one WSD multiplier
        assert r["update_applied"] is True and r["skipped_updates"] == 0
    assert [r["step"] for r in train] == list(range(1, 11))
    assert [r["consumed_samples"] for r in train] == [8 * s for s in range(1, 11)]
    assert train[-1]["tokens"] == 10 * 8 * 32
    # WSD over 10 updates: warmup round(0.5)=0, stable round(8.5)=8, decay 2; the last update runs at 0.1 x peak
    assert train[0]["lr_muon"] == pytest.approx(3e-3)
    assert train[-1]["lr_muon"] == pytest.approx(3e-4)
    # validation at r = K/2, K, 2K (K = 2)
    for e in records(run, "eval"):
        assert {"val_loss_r1", "val_loss_r2", "val_loss_r4"} <= e.keys()
    assert [c["step"] for c in records(run, "checkpoint")] == [3, 6, 9, 10]


def test_checkpoints_are_published_atomically_and_pruned():
    ckpt = reference_run().run_dir / "checkpoints"
    assert (ckpt / "latest").read_text() == "global_step10"
    tags = sorted(p.name for p in ckpt.iterdir() if p.is_dir())
    assert tags == ["global_step10", "global_step9"]  # keep_last = 2, no partial folder left
    manifest = json.loads((ckpt / "global_step10" / "manifest.json").read_text())
    assert manifest["step"] == 10 and manifest["consumed_samples"] == 80 and manifest["world_size"] == 1
    assert manifest["model"]["core_layers"] == 2 and manifest["model"]["train_loops"] == 2
    assert "recompute" not in manifest["model"]  # execution choice, may change on resume
    for name, entry in manifest["files"].items():
        assert (ckpt / "global_step10" / name).stat().st_size == entry["size"]
        assert len(entry["sha256"]) == 64
    assert "rng_state_rank0.pt" in manifest["files"]
    assert any(name.endswith("optim_states.pt") for name in manifest["files"])


def test_checkpoint_loads_for_export_and_matches_the_logged_validation():
    from megatron_loop.export.load import load_model_from_checkpoint

    run = reference_run().run_dir
    model, cfg = load_model_from_checkpoint(run / "checkpoints")
    assert cfg.model.train_loops == 2 and cfg.train.max_steps == 10
    from megatron_loop.data.loaders import build_train_valid_loaders

    loaders = build_train_valid_loaders(cfg.data, seq_length=32, global_batch_size=8, micro_batch_size=2,
                                        seed=cfg.train.seed, vocab_size=cfg.model.vocab_size)
    batches = [b["tokens"] for _, b in zip(range(2), loaders.valid)]
    with torch.no_grad():
        loss = sum(model(t, num_loops=2, labels=t).loss.item() for t in batches) / 2
    assert loss == pytest.approx(records(run, "eval")[-1]["val_loss_r2"], rel=1e-5)
