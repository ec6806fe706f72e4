"""``pretrain_loop.py --dry-run``: the analytic parameter count equals the model
built on the meta device for every backbone, layout and conditioning; the dry run imports no
torch / DeepSpeed / megatron-core; it prints the batch arithmetic; and each bad input it checks
(DeepSpeed JSON, data prefixes, tokenizer, batch, budget) is one ``error:`` line with exit 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from data_fixtures import data_assets
from megatron_loop.config import config_from_dict
from megatron_loop.plan import count_parameters
from train_fixtures import env, tiny_config
from testpaths import REPO, load_script

ROOT = REPO

MODELS = [  # backbone, layout and conditioning: every injection kind, window and timestep mechanism
    dict(backbone="tiny-llama", core_layers=2, train_loops=3),
    dict(backbone="tiny-qwen", prelude_layers=1, core_layers=2, train_loops=3, coda_layers=1),
    dict(backbone="llama3.1-1b", core_layers=4, train_loops=5),
    dict(backbone="qwen3-0.6b", prelude_layers=2, core_layers=2, train_loops=13),
    dict(backbone="tiny-llama", train_loops=5, initial_injection="scalar", history_injection="scalar",
         history_window=3),
    dict(backbone="tiny-qwen", train_loops=4, initial_injection="channel", history_injection="channel",
         history_window=2, timestep="loop_gating"),
    dict(backbone="tiny-llama", core_layers=3, initial_injection="residual_channel", timestep="branch_gating"),
    dict(backbone="tiny-qwen", core_layers=2, train_loops=6, initial_injection="dense", history_injection="dense",
         history_window=4, timestep="adaln"),
    dict(backbone="qwen3-0.6b", core_layers=4, train_loops=7, initial_injection="dense",
         history_injection="dense", history_window=2, timestep="adaln"),
    dict(hidden_size=48, intermediate_size=96, num_attention_heads=6, num_key_value_heads=3, head_dim=8,
         vocab_size=300, tie_word_embeddings=True, qk_norm=True, prelude_layers=1, coda_layers=2,
         timestep="branch_gating"),
]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: "-".join(f"{v}" for v in m.values()))
def test_analytic_parameter_count_equals_the_meta_device_build(model):
    from megatron_loop.model import build_model

    cfg = config_from_dict({"model": model}).model
    built = build_model(cfg, device="meta")
    assert tuple(count_parameters(cfg)) == (built.num_parameters(), built.num_parameters(backbone_only=True))


def _dry_run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "pretrain_loop.py"), *args, "--dry-run"], cwd=cwd, env=env(),
                          capture_output=True, text=True, timeout=120)


def test_dry_run_imports_nothing_heavy_and_prints_the_batch_arithmetic(tmp_path):
    config = tiny_config(tmp_path, train={"global_batch_size": 24, "micro_batch_size": 4})
    probe = (
        "import runpy, sys, json\n"
        f"sys.argv = ['pretrain_loop.py', '--config', {str(config)!r}, '--dry-run', '--json', '--data-parallel-size', "
        "'3']\n"
        f"try:\n    runpy.run_path({str(ROOT / 'pretrain_loop.py')!r}, run_name='__main__')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'deepspeed', 'megatron', 'transformers'})\n"
        "print(json.dumps({'heavy': heavy}))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    report, modules = (json.loads(line) for line in out.stdout.strip().splitlines())
    assert modules == {"heavy": []}
    assert report["data_parallel_size"] == 3 and report["accumulation"] == 2  # 24 = 4 x 2 x 3
    assert report["zero_stage"] == 1 and Path(report["deepspeed_config"]).is_absolute()
    assert report["train_prefixes"] == [data_assets().prefix]
    assert report["valid_prefixes"] == [data_assets().prefix + "_valid"]  # the sibling, by default
    assert report["params"] == count_parameters(config_from_dict({"model": {
        "backbone": "tiny-llama", "core_layers": 2, "train_loops": 2, "vocab_size": 640}}).model).total


def _cases(root: Path) -> dict[str, tuple[list[str], str]]:
    config = str(tiny_config(root, train={"output_dir": str(root / "out")}))
    tok_missing = root / "no_tokenizer_here"

    def c(*sets: str, extra: tuple[str, ...] = ()) -> list[str]:
        return ["--config", config, *[a for s in sets for a in ("--set", s)], *extra]

    (root / "bad.yaml").write_text("model: [unclosed\n")
    (root / "binary.yaml").write_bytes(b"\x7fELF\x02\x01\xd0\xff")
    (root / "ds.json").write_text('{"zero_optimization": ')
    (root / "empty_tokenizer").mkdir()
    return {
        "config_not_yaml": (["--config", str(root / "bad.yaml")],
                            r"bad\.yaml: not valid YAML \(expected ',' or '\]', but got '<stream end>' at line 2, "
                            r"column 1\)$"),
        "config_not_text": (["--config", str(root / "binary.yaml")],
                            r"binary\.yaml: not a text file; expected a YAML config \(UTF-8\)$"),
        "set_value_not_yaml": (c("train.lr=[1"), r"^--set 'train\.lr=\[1': value is not valid YAML \(.* at line 1, "
                                                 r"column 3\)$"),
        "deepspeed_json_not_json": (c(f"train.deepspeed_config={root}/ds.json"),
                                    r"ds\.json': not a DeepSpeed JSON config \(Expecting value: line 1 column 23 "
                                    r"\(char 22\)\); expected a JSON object"),
        "deepspeed_json_missing": (c("train.deepspeed_config=deepspeed_configs/zero7.json"),
                                   r"^train\.deepspeed_config='deepspeed_configs/zero7\.json': file not found "
                                   r"\(relative paths are taken from .*, then the repository\)"),
        "train_prefix_missing": (c("data.train_prefixes=[data/nowhere]"),
                                 r"^data\.train_prefixes\[0\]: indexed dataset prefix 'data/nowhere': missing "
                                 r"data/nowhere\.bin and data/nowhere\.idx \(relative to .*\); expected P\.bin"),
        "valid_prefix_missing": (c(f"data.valid_prefixes=[{root}/v]"),
                                 rf"^data\.valid_prefixes\[0\]: indexed dataset prefix '{re.escape(str(root))}/v': "
                                 r"missing .*v\.bin and .*v\.idx; expected"),
        "tokenizer_missing": (c(f"data.tokenizer={tok_missing}"),
                              rf"^data\.tokenizer='{re.escape(str(tok_missing))}': no such tokenizer folder or file"),
        "batch_not_divisible_by_ranks": (c(extra=("--data-parallel-size", "3")),
                                         r"^train\.global_batch_size=8: expected a multiple of train\.micro_batch_size"
                                         r"=2 x data-parallel size 3 = 6"),
        "no_ranks": (c(extra=("--data-parallel-size", "0")), r"^--data-parallel-size=0: expected a positive"),
        "budget_below_one_step": (c("train.max_steps=null", "train.train_tokens=100"),
                                  r"^train\.train_tokens=100: less than one global batch of 8 x 32 tokens"),
        # a plan this host cannot hold is refused before anything is built (issue 35 item 7)
        "index_beyond_memory": (c("train.max_steps=1e18"),
                                r"^train\.max_steps=1000000000000000000 x train\.global_batch_size=8 = "
                                r"8,000,000,000,000,000,000 samples: the data plan's index needs about [\d,]+ GiB"),
        "parameters_beyond_memory": (c("model.vocab_size=1e9"),
                                     r"^model\.vocab_size=1000000000, hidden_size=64, 2 blocks: 128,000,[\d,]+ "
                                     r"parameters .* need 477 GiB in fp32, more than this host's"),
        # the tokenizer check is real: a file that is not a tokenizer, a folder without one
        "tokenizer_not_a_tokenizer": (c(f"data.tokenizer={ROOT}/README.md"),
                                      r"^data\.tokenizer='.*README\.md': not a tokenizer \(README\.md is not a "
                                      r"tokenizer\.json\)"),
        "tokenizer_empty_folder": (c(f"data.tokenizer={root}/empty_tokenizer"),
                                   r"^data\.tokenizer='.*empty_tokenizer': a folder without tokenizer\.json or "
                                   r"tokenizer_config\.json"),
    }


def test_dry_run_bad_inputs_fail_cleanly(tmp_path):
    cases = _cases(tmp_path)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(cases, pool.map(lambda args: _dry_run(*args[0]), cases.values())))
    for name, (_, pattern) in cases.items():
        r = results[name]
        errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        assert r.returncode == 2 and len(errors) == 1 and r.stdout == "", (name, r.stderr[-2000:])
        assert re.search(pattern, errors[0][len("error: "):]), (name, errors[0])
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_relative_paths_are_resolved_from_the_working_directory(tmp_path, monkeypatch):
    """Stored absolute in the run config, so tools/convert_to_hf.py finds data.tokenizer from anywhere."""
    from data_fixtures import copy_prefix
    from megatron_loop.config import load_config

    (tmp_path / "d").mkdir()
    copy_prefix(tmp_path / "d")
    (tmp_path / "tok").mkdir()
    config = tmp_path / "c.yaml"
    config.write_text("train: {deepspeed_config: deepspeed_configs/zero2.json}\n"
                      "data: {train_prefixes: [d/p], valid_prefixes: [d/missing], tokenizer: tok}\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(config)
    assert cfg.data.train_prefixes == [str(tmp_path / "d" / "p")]
    assert cfg.data.tokenizer == str(tmp_path / "tok")
    assert cfg.train.deepspeed_config == str(ROOT / "deepspeed_configs" / "zero2.json")  # the repository's
    assert cfg.data.valid_prefixes == ["d/missing"]  # missing: kept as written, so the error names it
    hub = load_config(config, ["data.tokenizer=meta-llama/Llama-3.1-8B"])
    assert hub.data.tokenizer == "meta-llama/Llama-3.1-8B"


@pytest.mark.deps  # in the dependency drift check (tools/deps.py drift)
@pytest.mark.parametrize("config,expected", [
    ("examples/llama_4x5.yaml", dict(params=516_699_648, physical_depth=4, effective_depth=20, train_steps=5394,
                                     warmup_steps=270, stable_steps=4585, decay_steps=539, global_batch=1824,
                                     accumulation=6, data_parallel_size=8)),  # 38 x 6 x 8 = 1824
    ("examples/qwen_4x7.yaml", dict(params=218_507_264, physical_depth=4, effective_depth=28, train_steps=2860,
                                    warmup_steps=143, stable_steps=2431, decay_steps=286, global_batch=2048,
                                    accumulation=8, data_parallel_size=8)),  # 32 x 8 x 8 = 2048
])
def test_dry_run_cli(config, expected):
    prefix = data_assets().prefix  # the dry run checks that the data exists; the paper's is not here
    out = subprocess.run([sys.executable, "pretrain_loop.py", "--config", config, "--dry-run", "--json",
                          "--set", f"data.train_prefixes=[{prefix}]", "--set", f"data.valid_prefixes=[{prefix}_valid]",
                          "--data-parallel-size", "8"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    report = json.loads(lines[0])
    for key in ("params", "params_backbone", "physical_depth", "effective_depth", "train_tokens", "train_steps",
                "warmup_steps", "stable_steps", "decay_steps", "global_batch", "seq_length"):
        assert key in report
    for k, v in expected.items():
        assert report[k] == v, k


def test_skip_data_check_plans_a_paper_config_without_its_data(capsys):
    """``--skip-data-check``: the paper's FineWeb prefixes are not here, the rest is checked and planned
    (the numbers of test_dry_run_cli); without the flag the missing data is the error; the flag is
    refused without --dry-run."""
    pretrain_loop = load_script("pretrain_loop.py")
    config = str(ROOT / "examples" / "qwen_4x7.yaml")
    assert pretrain_loop.main(["--config", config, "--dry-run", "--skip-data-check", "--data-parallel-size", "8",
                               "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["data_checked"], report["train_steps"], report["accumulation"]) == (False, 2860, 8)
    assert report["train_prefixes"] == ["data/fineweb_edu_qwen"] and report["data_epochs"] == {}
    assert pretrain_loop.main(["--config", config, "--dry-run", "--data-parallel-size", "8"]) == 2
    assert "data.train_prefixes[0]: indexed dataset prefix 'data/fineweb_edu_qwen': missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        pretrain_loop.main(["--config", config, "--skip-data-check"])
    assert "--skip-data-check: only with --dry-run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        pretrain_loop.main(["--config", config, "--json"])
    assert "--json: only with --dry-run" in capsys.readouterr().err


def test_plain_dry_run_prints_the_start_up_statement_training_prints(capsys):
    """Without --json the dry run speaks to a person: the three lines training states at start (the same
    function, training/banner.py), then the data epochs, the validation and the files checked."""
    from megatron_loop.config import load_config
    from megatron_loop.dryrun import dry_run_report
    from megatron_loop.training.banner import startup_statement

    pretrain_loop = load_script("pretrain_loop.py")
    prefix = data_assets().prefix
    sets = ["--set", f"data.train_prefixes=[{prefix}]", "--set", f"data.valid_prefixes=[{prefix}_valid]",
            "--set", f"data.tokenizer={data_assets().tokenizer}"]  # not the demo's runs/demo/tokenizer: not made here
    config = str(ROOT / "examples" / "tiny_2x3_hist_lg.yaml")
    assert pretrain_loop.main(["--config", config, *sets, "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cfg = load_config(config, [s for s in sets if s != "--set"])
    report = dry_run_report(cfg)
    assert lines[:3] == startup_statement(cfg, report).splitlines()
    assert lines[3] == f"data: {prefix}: the plan reads {report['data_epochs'][prefix]:,.2f} epochs of it"
    assert lines[4] == f"validation: every 100 steps at r = 1, 3, 6 on {prefix}_valid"
    assert lines[5].startswith("checked: ") and f"{prefix}.bin/.idx" in lines[5]
    assert lines[6] == "nothing written; --json prints these numbers as one JSON line" and len(lines) == 7
