"""Loop-sweep evaluation end to end (issue 6): tools/eval_loops.py on an exported LoopLM with
local task files (shipped ProofWriter / CLUTRR / BBH YAMLs on hub-schema files, and the
generated reasoning tasks), held-out loss on an indexed prefix, results files and plots;
and the stock ``lm_eval`` command line with ``num_loops=R``."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import subprocess

import pytest
import torch

from data_fixtures import REPO, data_assets
from eval_fixtures import CLUTRR_LENGTHS, PER_DEPTH, PROOFWRITER_DEPTHS, write_local_tasks
from hf_fixtures import MODELS, hf_assets, offline_env

MODEL = "core_qwen_scalar_lg"  # 1+1x3+1, K = 3
LOOPS = (1, 3, 6)
SEQ = 32


def _eval_loops_main():
    spec = importlib.util.spec_from_file_location("eval_loops_tool", REPO / "tools" / "eval_loops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    local = write_local_tasks(tmp / "tasks")
    out = tmp / "eval"
    args = ["--model", str(hf_assets().exports[MODEL]), "--loops", ",".join(map(str, LOOPS)),
            "--tasks", f"proofwriter={local['proofwriter']},clutrr={local['clutrr']},bbh={local['bbh']},"
                       "piqa=looplm_tracking_local",
            "--include-path", str(tmp / "tasks"), "--include-path", str(data_assets().corpus / "eval"),
            "--limit", "12", "--valid-prefix", data_assets().prefix + "_valid", "--seq-length", str(SEQ),
            "--valid-sequences", "6", "--batch-size", "4", "--output", str(out), "--label", "tiny", "--no-progress"]
    assert _eval_loops_main()(args) == 0
    return out, json.loads((out / "results.json").read_text())


def test_results_record_scores_per_r_and_effective_depth(sweep):
    _, res = sweep
    assert res["loops"] == list(LOOPS) and res["layout"] == "1+1x3+1" and res["training_depth"] == 5
    assert res["effective_depth"] == {str(r): 1 + r + 1 for r in LOOPS}
    assert res["metrics"] == {"proofwriter": "acc", "clutrr": "acc_norm", "bbh": "acc", "piqa": "acc_norm"}
    for r in map(str, LOOPS):
        scores = {k: res["tasks"][k][r] for k in res["tasks"]}
        assert all(0.0 <= v <= 100.0 for v in scores.values())
        reasoning = (scores["proofwriter"] + scores["clutrr"] + scores["bbh"]) / 3
        assert res["groups"]["reasoning"][r] == pytest.approx(reasoning)
        assert res["groups"]["knowledge"][r] == pytest.approx(scores["piqa"])
        assert res["groups"]["overall"][r] == pytest.approx(sum(scores.values()) / 4)


def test_accuracy_is_stratified_by_depth(sweep):
    _, res = sweep
    for task, depths in (("proofwriter", PROOFWRITER_DEPTHS), ("clutrr", CLUTRR_LENGTHS)):
        for r in map(str, LOOPS):
            strata = res["per_depth"][task][r]
            assert sorted(map(int, strata)) == list(depths)  # the depth-3 ProofWriter config is dropped
            assert all(cell["n"] == PER_DEPTH for cell in strata.values())
            pooled = sum(c["accuracy"] * c["n"] for c in strata.values()) / sum(c["n"] for c in strata.values())
            assert pooled == pytest.approx(res["tasks"][task][r])  # strata partition the task's items
    assert "bbh" not in res["per_depth"] and "piqa" not in res["per_depth"]


def test_heldout_loss_matches_the_training_model(sweep):
    from megatron_loop.data.packed import PackedDataset
    from megatron_loop.model.io import load_model_from_checkpoint

    _, res = sweep
    model, _ = load_model_from_checkpoint(hf_assets().checkpoints[MODEL])
    data = PackedDataset(data_assets().prefix + "_valid", seq_length=SEQ, seed=1234)
    tokens = torch.stack([data[i]["tokens"] for i in range(6)])
    for r in LOOPS:
        cell = res["heldout"][str(r)]
        with torch.no_grad():
            expected = torch.stack([model(t[None], num_loops=r, labels=t[None]).loss for t in tokens]).mean()
        assert cell["sequences"] == 6
        assert cell["loss"] == pytest.approx(expected.item(), rel=1e-5)
        assert cell["perplexity"] == pytest.approx(math.exp(cell["loss"]))
    assert len({round(res["heldout"][str(r)]["loss"], 6) for r in LOOPS}) == 3


def test_csv_and_plots_are_written(sweep, tmp_path):
    from megatron_loop.eval.plots import plot_groups
    from megatron_loop.eval.report import read_results

    out, res = sweep
    rows = list(csv.reader((out / "results.csv").open()))
    assert rows[0][3:] == [f"r={r} (L={r + 2})" for r in LOOPS]
    names = [row[0] for row in rows]
    assert {"proofwriter", "clutrr", "bbh", "piqa", "knowledge", "reasoning", "overall",
            "heldout_loss", "heldout_perplexity"} <= set(names)
    overall = rows[names.index("overall")][3:]
    assert [float(v) for v in overall] == pytest.approx([res["groups"]["overall"][str(r)] for r in LOOPS], abs=1e-4)
    depth_rows = list(csv.DictReader((out / "per_depth.csv").open()))
    assert len(depth_rows) == len(LOOPS) * (len(PROOFWRITER_DEPTHS) + len(CLUTRR_LENGTHS))
    for png in ("groups_vs_depth.png", "per_depth_proofwriter.png", "per_depth_clutrr.png", "loss_vs_loops.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
    # several models on one Fig. 2 style figure
    other = read_results(out)
    other["label"], other["groups"]["overall"] = "shifted", {r: v + 5 for r, v in other["groups"]["overall"].items()}
    assert plot_groups([read_results(out), other], tmp_path / "two.png").stat().st_size > 5000


def _loglikelihood(model, tokenizer, context: str, continuation: str) -> float:
    """lm-eval's HFLM log-likelihood of ``continuation`` after ``context`` (same token split)."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    n_ctx = len(tokenizer(context, add_special_tokens=False)["input_ids"])
    ids = torch.tensor([whole])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1]).logits[0].float(), dim=-1)
    cont = whole[n_ctx:]
    positions = range(len(whole) - 1 - len(cont), len(whole) - 1)
    return sum(logp[p, t].item() for p, t in zip(positions, cont))


def test_lm_eval_command_line_runs_with_num_loops(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = hf_assets().exports[MODEL]
    r = 2 * MODELS[MODEL][1]["train_loops"]
    out = subprocess.run(
        [str(REPO / ".venv" / "bin" / "lm_eval") if (REPO / ".venv" / "bin" / "lm_eval").exists() else "lm_eval",
         "--model", "hf", "--model_args", f"pretrained={folder},trust_remote_code=True,num_loops={r}",
         "--tasks", "looplm_clutrr_local", "--include_path", str(data_assets().corpus / "eval"),
         "--limit", "3", "--batch_size", "2", "--device", "cpu", "--log_samples", "--output_path", str(tmp_path)],
        capture_output=True, text=True, env=offline_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "looplm_clutrr_local" in out.stdout and "acc_norm" in out.stdout
    sample = json.loads(next(tmp_path.rglob("samples_looplm_clutrr_local_*.jsonl")).read_text().splitlines()[0])
    args = sample["arguments"]["gen_args_0"]
    logged = float(sample["resps"][0][0][0])
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model.config.num_loops = r
    assert logged == pytest.approx(_loglikelihood(model, tokenizer, args["arg_0"], args["arg_1"]), abs=1e-3)
    model.config.num_loops = MODELS[MODEL][1]["train_loops"]  # the kwarg really changed the model's r
    assert logged != pytest.approx(_loglikelihood(model, tokenizer, args["arg_0"], args["arg_1"]), abs=1e-3)


def test_native_nonloop_export_sweeps_only_r1(tmp_path, capsys):
    folder = str(hf_assets().exports["nonloop_llama"])
    common = ["--model", folder, "--tasks", "none", "--valid-prefix", data_assets().prefix + "_valid",
              "--seq-length", str(SEQ), "--valid-sequences", "2", "--no-progress"]
    main = _eval_loops_main()
    assert main([*common, "--loops", "1", "--output", str(tmp_path / "ok")]) == 0
    res = json.loads((tmp_path / "ok" / "results.json").read_text())
    assert res["layout"] == "0+3x1+0" and res["effective_depth"] == {"1": 3} and res["tasks"] == {}
    assert res["heldout"]["1"]["sequences"] == 2 and (tmp_path / "ok" / "loss_vs_loops.png").is_file()
    assert not (tmp_path / "ok" / "groups_vs_depth.png").exists()  # no task ran
    assert main([*common, "--loops", "1,2", "--output", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --loops 2") and "NonLoop" in err
