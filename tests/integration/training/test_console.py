"""What an operator sees of a run: one console line per logged step with
the progress bar off (SLURM logs), validation lines, the data reuse at start, the end-of-run
summary, TensorBoard scalars equal to metrics.jsonl, ``tools/plot_metrics.py``; and the
validation data rules (``valid_prefixes: []`` disables validation, a validation set smaller
than one micro-batch stops only a run that validates)."""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from data_fixtures import data_assets
from megatron_loop.config import config_from_dict
from megatron_loop.training.metrics import MetricsLogger, format_train_line
from probe_fixtures import write_prefix
from train_fixtures import command, env, records, tiny_config
from testpaths import REPO

ROOT = REPO

RECORD = {"event": "train", "step": 10, "loss": 5.43214, "lr_muon": 3e-3, "lr_adamw": 3e-3, "grad_norm": 1.2345,
          "tokens_per_s": 12345.6, "mfu": 0.0123, "mem_gib": 0.451, "mem_peak_gib": 0.502, "step_time_s": 0.1049,
          "skipped_updates": 0}


def test_step_line_has_what_megatron_and_torchtitan_print():
    assert format_train_line(RECORD, 300) == (
        "step  10/300 | loss 5.4321 | lr 3.00e-03 | grad norm 1.234 | 12,346 tok/s | MFU 1.23% | "
        "mem 0.45 GiB (peak 0.50) | 0.105 s/step")
    split = format_train_line({**RECORD, "lr_adamw": 3e-4, "skipped_updates": 2}, 10)
    assert "lr 3.00e-03 (Muon) 3.00e-04 (AdamW)" in split and split.endswith("| skipped updates 2")
    assert "MFU" not in format_train_line({**RECORD, "mfu": None}, 300)  # CPU: no known peak, no MFU shown


def _cfg(tmp_path, **train):
    return config_from_dict({"train": {"output_dir": str(tmp_path / "run"), "seq_length": 32, "global_batch_size": 8,
                                       "micro_batch_size": 2, **train}, "logging": {"progress_bar": False}})


def test_validation_line_data_reuse_and_summary(tmp_path, capsys):
    logger = MetricsLogger(_cfg(tmp_path, eval_interval=5, eval_loops=[1, 2, 4]), enabled=True, start_step=0,
                           total_steps=20)
    usage = [{"prefix": "/d/p", "weight": 1.0, "tokens": 2000, "samples": 160, "epochs": 160 * 32 / 2000}]
    logger.data_usage(usage, ["/d/p_valid"], 4)
    logger.log({**RECORD, "step": 20, "loss": 3.25})
    logger.log({"event": "eval", "step": 20, "val_loss_r2": 3.5, "val_loss_r1": 4.0, "val_loss_r4": 3.75})
    logger.log({"event": "checkpoint", "step": 20, "tag": "global_step20", "path": "/ck/global_step20"})
    logger.summary(20, 160, 3725.4)
    logger.close()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("data: /d/p: 2,000 tokens = 62 sequences of 32 per epoch; this run reads 160 sequences "
                      "= 2.56 epochs (repeated data)")
    assert err[1] == "validation: /d/p_valid: 4 micro-batches at r = 1, 2, 4 every 5 steps"
    assert err[3] == "validation at step 20 | loss r=1 4.0000 | r=2 3.5000 | r=4 3.7500"
    assert err[4:] == [
        "training finished at step 20/20 after 1:02:05 (wall time of this run)",
        "  tokens: 5,120 in total, 5,120 in this run; 2.56 epochs of /d/p",
        "  final train loss 3.2500 (step 20) | validation at step 20 | loss r=1 4.0000 | r=2 3.5000 | r=4 3.7500",
        "  checkpoint: /ck/global_step20",
        f"  metrics: {tmp_path / 'run' / 'metrics.jsonl'} (plot: python tools/plot_metrics.py {tmp_path / 'run'})"]
    summary = records(tmp_path / "run", "summary")[0]
    assert summary["final_loss"] == 3.25 and summary["val_loss_r2"] == 3.5 and summary["tokens"] == 5120
    assert summary["epochs"] == {"/d/p": pytest.approx(2.56)}


def test_startup_statement_states_model_plan_and_placement_from_the_dry_run_numbers():
    """The start-up block (nanoGPT / torchtitan style) formats the dry run's own dict: parameters,
    layout p+s x K+c and L(K) = p + K s + c, tokens = steps x global batch x seq_length, the WSD
    split round(5 %) / round(85 %) / rest (App. C.2), the batch arithmetic, TP x DP, ZeRO, precision."""
    from megatron_loop.dryrun import dry_run_report
    from megatron_loop.plan import count_parameters
    from megatron_loop.training.banner import startup_statement

    cfg = config_from_dict({"model": {"backbone": "tiny-llama", "prelude_layers": 1, "core_layers": 2,
                                      "coda_layers": 1, "train_loops": 3, "vocab_size": 640,
                                      "history_injection": "scalar", "history_window": 2, "timestep": "loop_gating"},
                            "train": {"max_steps": 120, "global_batch_size": 8, "micro_batch_size": 2,
                                      "seq_length": 32, "precision": "fp32"},
                            "data": {"train_prefixes": [data_assets().prefix]}})
    from megatron_loop.config import resolve_paths

    report = dry_run_report(resolve_paths(cfg), 2)
    params = count_parameters(cfg.model).total
    model, plan, parallel = startup_statement(cfg, report).splitlines()
    backbone = count_parameters(cfg.model).backbone
    assert model == (f"model: LoopLM tiny-llama 1+2x3+1 (L(K) = 8 block applications at K = 3, 4 physical blocks), "
                     f"{params:,} parameters ({params / 1e3:.2f}K; backbone {backbone:,}); "
                     "conditioning: timestep loop_gating, history scalar (window 2)")
    assert plan == ("plan: 30,720 tokens = 120 steps x 8 sequences x 32 tokens; "
                    "WSD 6 warmup / 102 stable / 12 decay steps")
    assert parallel == ("parallel: TP 1 x DP 2 (world 2), global batch 8 = micro 2 x accumulation 2 x DP 2; "
                        "ZeRO 1, precision fp32")
    from megatron_loop.config import load_config

    demo = load_config(ROOT / "examples" / "tiny_2x3_hist_lg.yaml")  # the README shows its statement
    assert startup_statement(demo, dry_run_report(demo, 1, check_data=False)) in (ROOT / "README.md").read_text()


def test_data_reuse_is_samples_times_seq_length_over_prefix_tokens():
    from megatron_loop.config import DataConfig
    from megatron_loop.data.indexed import count_tokens
    from megatron_loop.data.loaders import build_train_valid_loaders

    prefix = data_assets().prefix
    tokens = count_tokens(prefix)
    samples = 5 * (tokens // 32) // 2  # 2.5 epochs of 32-token sequences
    data = DataConfig(train_prefixes=[prefix], valid_prefixes=[], num_workers=0, order="shuffled")
    loaders = build_train_valid_loaders(data, seq_length=32, global_batch_size=8, micro_batch_size=2,
                                        train_samples=samples)
    (usage,) = loaders.train_usage
    assert usage["samples"] == samples and usage["tokens"] == tokens
    assert usage["epochs"] == samples * 32 / tokens and 2.4 < usage["epochs"] < 2.6
    assert loaders.train_dataset.num_epochs == 3


def test_empty_valid_prefixes_disable_validation_despite_a_sibling():
    from megatron_loop.config import resolve_paths
    from megatron_loop.config.deepspeed import DeepSpeedSettings
    from megatron_loop.data.loaders import build_train_valid_loaders
    from megatron_loop.training.preflight import check_input_files

    prefix = data_assets().prefix  # has a _valid sibling
    base = {"train": {"eval_interval": 5, "seq_length": 32}, "data": {"train_prefixes": [prefix]}}

    def valid_of(eval_interval=5, **data):
        cfg = config_from_dict({"train": {**base["train"], "eval_interval": eval_interval},
                                "data": {**base["data"], **data}})
        cfg = resolve_paths(cfg)  # as load_config: the repository's deepspeed_configs/ from any working directory
        # what --dry-run reports
        checked = check_input_files(cfg, DeepSpeedSettings.of_run(cfg, 4, 1))["valid_prefixes"]
        loaders = build_train_valid_loaders(cfg.data, seq_length=32, global_batch_size=8, micro_batch_size=2,
                                            validation=bool(cfg.train.eval_interval))
        assert loaders.valid_prefixes == checked
        return checked, loaders.valid

    spec, loader = valid_of(valid_prefixes=[])
    assert spec == [] and loader is None
    spec, loader = valid_of()
    assert spec == [prefix + "_valid"] and loader is not None
    spec, loader = valid_of(eval_interval=0)  # no periodic validation: the sibling is not opened
    assert spec == [] and loader is None


@pytest.fixture(scope="module")
def tiny_valid_runs(tmp_path_factory):
    """Two runs with a validation set of 2 short documents (fewer sequences than a micro-batch of
    4): without periodic validation (eval_interval 0; progress bar off, log_interval 2, TensorBoard
    on), and with it. Launched together."""
    root = tmp_path_factory.mktemp("tiny_valid")
    (root / "v").mkdir()
    valid = write_prefix(root / "v", num_docs=2, vocab=600)
    common = dict(train={"max_steps": 4, "log_interval": 2, "micro_batch_size": 4, "save_interval": 100},
                  data={"train_prefixes": [data_assets().prefix], "valid_prefixes": [valid], "num_workers": 0},
                  logging={"progress_bar": False, "tensorboard": True})
    off = tiny_config(root / "off", **{**common, "train": {**common["train"], "eval_interval": 0}})
    on = tiny_config(root / "on", **{**common, "train": {**common["train"], "eval_interval": 2}})

    def run(config):
        return subprocess.run(command("--config", str(config)), cwd=ROOT, env=env(), capture_output=True, text=True,
                              timeout=400)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, [off, on]))
    return root, valid, results


def test_run_without_validation_ignores_a_tiny_validation_set_and_logs_every_interval(tiny_valid_runs):
    root, _, (result, _) = tiny_valid_runs
    assert result.returncode == 0, result.stderr[-4000:]
    run = root / "off" / "run"
    steps = [line for line in result.stderr.splitlines() if line.startswith("step ")]
    assert [s.split(" | ")[0] for s in steps] == ["step 2/4", "step 4/4"]  # no bar: the lines are the log
    losses = {r["step"]: r["loss"] for r in records(run, "train")}
    assert steps[-1].split(" | ")[1] == f"loss {losses[4]:.4f}"
    assert "validation: off (train.eval_interval=0)" in result.stderr
    from megatron_loop.config import load_config
    from megatron_loop.dryrun import dry_run_report
    from megatron_loop.training.banner import startup_statement

    cfg = load_config(root / "off" / "tiny.yaml")  # rank 0 states what --dry-run computes, once
    statement = startup_statement(cfg, dry_run_report(cfg, 1))
    assert result.stderr.count(statement) == 1 and "plan: 1,024 tokens = 4 steps x 8 sequences" in statement
    assert re.search(r"^data: .*train: [\d,]+ tokens = [\d,]+ sequences of 32 per epoch; this run reads 32 sequences",
                     result.stderr, flags=re.M)
    assert "training finished at step 4/4 after" in result.stderr
    assert f"  checkpoint: {run.resolve() / 'checkpoints' / 'global_step4'}" in result.stderr
    assert records(run, "summary")[0]["final_loss"] == losses[4]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    scalars = {e.step: e.value for e in events.Scalars("train/loss")}
    assert scalars.keys() == {2, 4}
    assert all(scalars[s] == pytest.approx(losses[s], rel=1e-6) for s in scalars)


def test_validation_set_smaller_than_a_micro_batch_stops_a_validating_run(tiny_valid_runs):
    root, valid, (_, result) = tiny_valid_runs
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
    assert re.fullmatch(rf"error: data\.valid_prefixes \['{re.escape(valid)}'\]: \d sequences of seq_length 32; "
                        r"expected at least micro_batch_size x data-parallel size = 4 for validation \(or train "
                        r"without it: train\.eval_interval=0 or data\.valid_prefixes=\[\]\)", errors[0]), errors[0]
    assert "Traceback" not in result.stderr and not (root / "on" / "run").exists()


def _write_metrics(run: Path, losses: list[float], lr: float, eval_every: int = 2) -> None:
    run.mkdir(parents=True)
    lines = []
    for i, loss in enumerate(losses, start=1):
        lines.append({"event": "train", "step": i, "tokens": 256 * i, "loss": loss, "lr_muon": lr * i,
                      "lr_adamw": lr * i, "grad_norm": 1.0, "tokens_per_s": 1e3, "mfu": 0.01 * i})
        if i % eval_every == 0:
            lines.append({"event": "eval", "step": i, "val_loss_r1": loss + 1, "val_loss_r2": loss + 0.5})
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"event": "tr')


def test_plot_metrics_draws_several_runs_on_one_figure(tmp_path, capsys):
    from megatron_loop.curves import plot_runs, read_run

    _write_metrics(tmp_path / "a", [5.0, 4.0, 3.5, 3.0], 1e-3)
    _write_metrics(tmp_path / "b", [6.0, 5.0], 2e-3)
    fig = plot_runs([read_run(tmp_path / "a"), read_run(tmp_path / "b" / "metrics.jsonl", "B")], x="tokens")
    loss_ax, lr_ax, _, _, mfu_ax, _ = fig.axes
    lines = {line.get_label(): line for line in loss_ax.get_lines()}
    assert set(lines) == {"a: training loss", "a: validation loss at r = 1", "a: validation loss at r = 2",
                          "B: training loss", "B: validation loss at r = 1", "B: validation loss at r = 2"}
    assert list(lines["a: training loss"].get_xdata()) == [256e-6, 512e-6, 768e-6, 1024e-6]  # millions of tokens
    assert list(lines["a: training loss"].get_ydata()) == [5.0, 4.0, 3.5, 3.0]
    assert list(lines["a: validation loss at r = 2"].get_ydata()) == [4.5, 3.5]
    assert list(lines["B: validation loss at r = 1"].get_xdata()) == [512e-6]
    assert [list(line.get_ydata()) for line in lr_ax.get_lines()] == [[1e-3, 2e-3, 3e-3, 4e-3], [2e-3, 4e-3]]
    assert list(mfu_ax.get_lines()[0].get_ydata()) == pytest.approx([1, 2, 3, 4])
    assert "nats" in loss_ax.get_ylabel() and mfu_ax.get_ylabel() == "MFU (%)"

    import importlib.util

    spec = importlib.util.spec_from_file_location("plot_metrics", ROOT / "tools" / "plot_metrics.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main([str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert tool.main([str(tmp_path / "nowhere"), "--output", str(tmp_path / "d.png")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {tmp_path / 'nowhere'}: no metrics.jsonl; expected a run folder (train.output_dir) or its metrics.jsonl")
    assert tool.main([str(tmp_path / "a"), "--labels", "x,y", "--output", str(tmp_path / "d.png")]) == 2
    assert "--labels 'x,y': 2 labels for 1 runs; expected one per RUN" in capsys.readouterr().err
    assert not (tmp_path / "d.png").exists()
