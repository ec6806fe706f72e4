"""Metrics sinks (issue 5 item 6): JSONL truncation on resume, wandb offline without an API key
(project and run names from the config), the tqdm bar on rank 0, nothing on other ranks."""

from __future__ import annotations

import json

from megatron_loop.config import config_from_dict
from megatron_loop.training.metrics import MetricsLogger, truncate_after


def _cfg(tmp_path, **logging):
    return config_from_dict({"train": {"output_dir": str(tmp_path / "run"), "seq_length": 32},
                             "logging": logging})


def _record(step, loss=1.0):
    return {"event": "train", "step": step, "loss": loss, "tokens_per_s": 100.0}


def test_resume_drops_records_past_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(_record(s)) for s in range(1, 6)] + ['{"event": "train", "st']  # torn by a crash
    path.write_text("\n".join(lines))
    truncate_after(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_jsonl_and_progress_bar_on_rank_zero_only(tmp_path, capsys):
    cfg = _cfg(tmp_path, progress_bar=True)
    logger = MetricsLogger(cfg, enabled=True, start_step=0, total_steps=4)
    logger.log(_record(1, 2.5))
    logger.message("hello")
    logger.close()
    err = capsys.readouterr().err
    assert "hello" in err and "loss=2.5000" in err and "1/4" in err
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text())["loss"] == 2.5
    other = MetricsLogger(_cfg(tmp_path / "r1"), enabled=False, start_step=0, total_steps=4)
    other.log(_record(1))
    other.close()
    assert not (tmp_path / "r1").exists()


def test_wandb_runs_offline_without_api_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = _cfg(tmp_path, wandb_project="looplm-test", wandb_run_name="tiny", progress_bar=False)
    logger = MetricsLogger(cfg, enabled=True, start_step=0, total_steps=2)
    run = logger._wandb
    assert run is not None and run.settings.mode == "offline"
    assert run.project == "looplm-test" and run.name == "tiny"
    logger.log(_record(1))
    logger.close()
    run_id = (tmp_path / "run" / "wandb_run_id").read_text()
    assert list((tmp_path / "run" / "wandb").glob(f"offline-run-*-{run_id}"))
