"""Loop-sweep evaluation end to end: tools/eval_loops.py on an exported LoopLM with
local task files (shipped ProofWriter / CLUTRR / BBH YAMLs on hub-schema files, and the
generated reasoning tasks), held-out loss on an indexed prefix, results files and plots;
and the stock ``lm_eval`` command line with ``num_loops=R``."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data_fixtures import REPO, data_assets
from eval_fixtures import CLUTRR_LENGTHS, PER_DEPTH, PROOFWRITER_DEPTHS, write_local_tasks
from hf_fixtures import MODELS, hf_assets, offline_env

pytestmark = [pytest.mark.deps, pytest.mark.slow]  # in the dependency drift check (tools/deps.py drift)

MODEL = "core_qwen_scalar_lg"  # 1+1x3+1, K = 3
LOOPS = (1, 3, 6)
SEQ = 32


def _eval_loops_main():
    spec = importlib.util.spec_from_file_location("eval_loops_tool", REPO / "tools" / "eval_loops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture(scope="module")
def local_tasks(tmp_path_factory) -> tuple[dict, list[str]]:
    """({paper key: local lm-eval task}, the --include-path arguments)."""
    tmp = tmp_path_factory.mktemp("tasks")
    local = write_local_tasks(tmp / "tasks")
    return local, ["--include-path", str(tmp / "tasks"), "--include-path", str(data_assets().corpus / "eval")]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, local_tasks):
    tmp = tmp_path_factory.mktemp("sweep")
    local, include = local_tasks
    out = tmp / "eval"
    args = ["--model", str(hf_assets().exports[MODEL]), "--loops", ",".join(map(str, LOOPS)),
            "--tasks", f"proofwriter={local['proofwriter']},clutrr={local['clutrr']},bbh={local['bbh']},"
                       "piqa=looplm_tracking_local", *include,
            "--limit", "12", "--valid-prefix", data_assets().prefix + "_valid", "--seq-length", str(SEQ),
            "--valid-sequences", "6", "--batch-size", "4", "--output", str(out), "--label", "tiny", "--no-progress"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert _eval_loops_main()(args) == 0
    return out, json.loads((out / "results.json").read_text()), printed.getvalue()


def test_results_record_scores_per_r_and_effective_depth(sweep):
    _, res, _ = sweep
    assert res["loops"] == list(LOOPS) and res["layout"] == "1+1x3+1" and res["training_depth"] == 5
    assert res["effective_depth"] == {str(r): 1 + r + 1 for r in LOOPS}
    assert res["metrics"] == {"proofwriter": "acc", "clutrr": "acc_norm", "bbh": "acc", "piqa": "acc_norm"}
    # Loop Gating on the rescaled grid (t_l = l/r): each r has its own trajectory, so one pass per r
    (passes,) = res["sweep_passes"]
    assert passes["mode"] == "per-r" and passes["loops"] == list(LOOPS)
    assert passes["reason"].startswith("timestep conditioning (loop_gating) on the rescaled grid")
    for r in map(str, LOOPS):
        scores = {k: res["tasks"][k][r] for k in res["tasks"]}
        assert all(0.0 <= v <= 100.0 for v in scores.values())
        reasoning = (scores["proofwriter"] + scores["clutrr"] + scores["bbh"]) / 3
        assert res["groups"]["reasoning"][r] == pytest.approx(reasoning)
        assert res["groups"]["knowledge"][r] == pytest.approx(scores["piqa"])
        assert res["groups"]["overall"][r] == pytest.approx(sum(scores.values()) / 4)


def test_accuracy_is_stratified_by_depth(sweep):
    _, res, _ = sweep
    for task, depths in (("proofwriter", PROOFWRITER_DEPTHS), ("clutrr", CLUTRR_LENGTHS)):
        for r in map(str, LOOPS):
            strata = res["per_depth"][task][r]
            assert sorted(map(int, strata)) == list(depths)  # the depth-3 ProofWriter config is dropped
            assert all(cell["n"] == PER_DEPTH for cell in strata.values())
            pooled = sum(c["accuracy"] * c["n"] for c in strata.values()) / sum(c["n"] for c in strata.values())
            assert pooled == pytest.approx(res["tasks"][task][r])  # strata partition the task's items
    # every task whose items carry a depth is stratified, whatever its slot: here the generated
    # tracking task (in the piqa slot), whose YAML also declares the depths seen in training
    tracking = res["per_depth"]["piqa"]
    assert all(sorted(map(int, tracking[r])) == [1, 2, 3, 4] for r in map(str, LOOPS))
    assert res["trained_depths"] == {"piqa": [1, 2, 3]}  # data_fixtures: train_max_depth=3, eval_max_depth=4
    assert res["depth_axes"]["proofwriter"] == "proof depth" and res["depth_axes"]["piqa"] == "depth"
    assert "bbh" not in res["per_depth"]  # its items have no depth


def test_standard_errors_and_chance_levels(sweep):
    """lm-eval's standard error of a mean accuracy over n items is sqrt(p (1 - p) / (n - 1)); groups
    combine them as sqrt(sum se^2) / n; chance is the mean over items of 1 / number of choices."""
    _, res, _ = sweep
    items = {"proofwriter": 12, "clutrr": 9, "bbh": 4, "piqa": 12}  # --limit 12 of the fixture files
    for r in map(str, LOOPS):
        for task, n in items.items():
            p = res["tasks"][task][r] / 100
            assert res["tasks_stderr"][task][r] == pytest.approx(100 * math.sqrt(p * (1 - p) / (n - 1)))
        reasoning = [res["tasks_stderr"][t][r] for t in ("proofwriter", "clutrr", "bbh")]
        assert res["groups_stderr"]["reasoning"][r] == pytest.approx(math.sqrt(sum(e * e for e in reasoning)) / 3)
        for depth, cell in res["per_depth"]["proofwriter"][r].items():
            q, m = cell["accuracy"] / 100, cell["n"]
            assert cell["stderr"] == pytest.approx(100 * math.sqrt(q * (1 - q) / (m - 1)))
            assert cell["chance"] == pytest.approx(100 / 3)
        assert res["heldout"][r]["stderr"] > 0
    # ProofWriter: True/False/Unknown; CLUTRR: its 21 relation labels; BBH file: three 2-option items and one
    # 3-option item; the generated tracking items: 3 objects
    assert res["chance"] == pytest.approx({"proofwriter": 100 / 3, "clutrr": 100 / 21,
                                           "bbh": 100 * (3 / 2 + 1 / 3) / 4, "piqa": 100 / 3})
    assert res["groups_chance"]["reasoning"] == pytest.approx((100 / 3 + 100 / 21 + 100 * (3 / 2 + 1 / 3) / 4) / 3)
    assert res["groups_chance"]["overall"] == pytest.approx(sum(res["chance"].values()) / 4)


def test_console_table_lists_every_task_and_r(sweep):
    _, res, printed = sweep
    lines = printed.splitlines()
    header = next(line for line in lines if line.startswith("|") and "Task" in line)
    assert [c.strip() for c in header.strip("|").split("|")][4:] == [f"r={r} (L={r + 2})" for r in LOOPS]
    row = next(line for line in lines if line.startswith("| proofwriter"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    r3 = str(LOOPS[1])
    assert cells[5] == f"{res['tasks']['proofwriter'][r3]:.2f} ± {res['tasks_stderr']['proofwriter'][r3]:.2f}"
    assert cells[3] == f"{res['chance']['proofwriter']:.2f}"
    assert any(line.startswith("| overall") for line in lines)
    assert any(line.startswith("| heldout_loss") for line in lines)
    assert "Overwriting default num_fewshot" not in printed  # zero-shot is set once, not warned per r


def test_heldout_loss_matches_the_training_model(sweep):
    from megatron_loop.data.packed import PackedDataset
    from megatron_loop.export.load import load_model_from_checkpoint

    _, res, _ = sweep
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

    out, res, _ = sweep
    rows = list(csv.reader((out / "results.csv").open()))
    assert rows[0][3:] == [f"r={r} (L={r + 2})" for r in LOOPS] + ["chance"]
    names = [(row[0], row[2]) for row in rows]
    assert {("proofwriter", "acc"), ("proofwriter", "acc_stderr"), ("clutrr", "acc_norm_stderr"), ("bbh", "acc"),
            ("piqa", "acc_norm"), ("knowledge", "mean"), ("reasoning", "mean_stderr"), ("overall", "mean"),
            ("heldout_loss", "loss"), ("heldout_loss", "loss_stderr"),
            ("heldout_perplexity", "perplexity")} <= set(names)
    overall = rows[names.index(("overall", "mean"))][3:]
    assert [float(v) for v in overall] == pytest.approx(
        [res["groups"]["overall"][str(r)] for r in LOOPS] + [res["groups_chance"]["overall"]], abs=1e-4)
    stderr = rows[names.index(("proofwriter", "acc_stderr"))][3:-1]
    assert [float(v) for v in stderr] == pytest.approx([res["tasks_stderr"]["proofwriter"][str(r)] for r in LOOPS],
                                                       abs=1e-4)
    depth_rows = list(csv.DictReader((out / "per_depth.csv").open()))
    assert len(depth_rows) == len(LOOPS) * (len(PROOFWRITER_DEPTHS) + len(CLUTRR_LENGTHS) + 4)  # + tracking 1-4
    assert {"stderr", "chance"} <= set(depth_rows[0])
    for png in ("groups_vs_depth.png", "per_depth_proofwriter.png", "per_depth_clutrr.png", "per_depth_piqa.png",
                "loss_vs_loops.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
    # several models on one Fig. 2 style figure
    other = read_results(out)
    other["label"], other["groups"]["overall"] = "shifted", {r: v + 5 for r, v in other["groups"]["overall"].items()}
    assert plot_groups([read_results(out), other], tmp_path / "two.png").stat().st_size > 5000


def _errorbars(ax) -> list[tuple[str, list, list, list]]:
    """(label, x, y, half error bar) of every error-bar series drawn on ``ax``."""
    out = []
    for container in ax.containers:
        line, _, (bars,) = container.lines
        half = [(seg[1][1] - seg[0][1]) / 2 for seg in bars.get_segments()]
        out.append((container.get_label(), list(line.get_xdata()), list(line.get_ydata()), half))
    return out


def test_plots_draw_the_json_numbers(sweep):
    """The figures plot exactly the numbers of results.json: scores, standard errors as error bars,
    the chance level, the training depth L(K) and the extrapolation region (legend entries), integer ticks."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from megatron_loop.eval.plots import groups_figure, loss_figure, per_depth_figure
    from megatron_loop.eval.report import read_results

    out, _, _ = sweep
    res = read_results(out)
    other = dict(res, label="copy")  # an identical second model: dodged, not hidden behind the first
    fig = groups_figure([res, other])
    for ax, key in zip(fig.axes, ("overall", "knowledge", "reasoning")):
        (label_a, xa, ya, ea), (label_b, xb, *_) = _errorbars(ax)
        n = sorted(set(res["items"].values()))  # the items per task of this sweep's --limit
        facts = ", ".join([res["layout"]] + ([res["conditioning"]] if res["conditioning"] != "none" else [])
                          + [f"n = {n[0]}" + (f"-{n[-1]}" if len(n) > 1 else "") + " per task"])
        assert label_a == f"tiny ({facts})" and label_b == f"copy ({facts})"
        assert ya == pytest.approx([res["groups"][key][r] for r in LOOPS])
        assert ea == pytest.approx([res["groups_stderr"][key][r] for r in LOOPS])
        assert [round(x) for x in xa] == [r + 2 for r in LOOPS] and all(b > a for a, b in zip(xa, xb))
        chance = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert chance[0].get_ydata()[0] == pytest.approx(res["groups_chance"][key])
        assert isinstance(ax.xaxis.get_major_locator(), MaxNLocator)
    legend = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert {"chance level (mean 1/#choices)", "training depth L(K) = 5",
            "extrapolation L(r) > L(K) (r > K)"} <= set(legend)
    plt.close(fig)

    fig = per_depth_figure(res, "piqa")  # the tracking items: depths 1-3 trained, 4 not
    series = {label: (y, e) for label, _, y, e in _errorbars(fig.axes[0])}
    assert set(series) == {"depth 1 (trained)", "depth 2 (trained)", "depth 3 (trained)", "depth 4 (not in training)"}
    y, e = series["depth 4 (not in training)"]
    assert y == pytest.approx([res["per_depth"]["piqa"][r][4]["accuracy"] for r in LOOPS])
    assert e == pytest.approx([res["per_depth"]["piqa"][r][4]["stderr"] for r in LOOPS])
    plt.close(fig)

    fig = loss_figure([res])
    ((_, x, y, e),) = _errorbars(fig.axes[0])
    assert x == [res["effective_depth"][r] for r in LOOPS]
    assert y == pytest.approx([res["heldout"][r]["loss"] for r in LOOPS])
    assert e == pytest.approx([res["heldout"][r]["stderr"] for r in LOOPS])
    assert "nats" in fig.axes[0].get_ylabel() and fig.axes[0].get_xlabel() == "effective depth L(r) = p + r·s + c"
    plt.close(fig)


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
        [str(Path(sys.executable).with_name("lm_eval")),  # the console script of this interpreter's lm-eval
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


def test_default_output_is_next_to_the_model_folder(tmp_path):
    folder = tmp_path / "exports" / "nonloop"
    shutil.copytree(hf_assets().exports["nonloop_llama"], folder)
    assert _eval_loops_main()(["--model", str(folder), "--loops", "1", "--tasks", "none", "--valid-prefix",
                               data_assets().prefix + "_valid", "--seq-length", str(SEQ), "--valid-sequences", "2",
                               "--no-progress"]) == 0
    assert (tmp_path / "exports" / "nonloop_eval" / "results.json").is_file()
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        p.name for p in hf_assets().exports["nonloop_llama"].iterdir())  # nothing written into the export


def _bad_arguments(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (arguments after --model, the exact error line). Message catalogue: docs/ERRORS.md."""
    valid = data_assets().prefix + "_valid"
    held_out = ["--tasks", "none", "--valid-prefix", valid]
    return {
        "repeated_loops": (["--loops", "1,3,3", *held_out],
                           "error: --loops '1,3,3': r=3 listed twice; expected distinct loop counts"),
        "unsorted_loops": (["--loops", "6,1,3", *held_out],
                           "error: --loops '6,1,3': expected loop counts in increasing order, e.g. 1,3,6"),
        "loops_below_one": (["--loops", "0,1", *held_out],
                            "error: --loops '0,1': expected loop counts r >= 1, e.g. 1,2,4,8"),
        "negative_limit": (["--loops", "1", "--limit", "-5", *held_out],
                           "error: --limit -5: expected a number of items per task (an integer >= 1) or a fraction "
                           "of each task in (0, 1)"),
        "fractional_limit": (["--loops", "1", "--limit", "2.5", *held_out],
                             "error: --limit 2.5: expected a number of items per task (an integer >= 1) or a "
                             "fraction of each task in (0, 1)"),
        "compare_missing": (["--loops", "1", "--compare", str(tmp_path / "none.json"), *held_out],
                            f"error: --compare {tmp_path / 'none.json'}: not found; expected a results.json written "
                            "by tools/eval_loops.py (or its folder)"),
        "nothing_to_evaluate": (["--loops", "1", "--tasks", "none"],
                                "error: --tasks none: nothing to evaluate; pass --valid-prefix P (an indexed prefix, "
                                "P.bin/P.idx) for the held-out loss, or name tasks to run"),
        "valid_prefix_missing": (["--loops", "1", "--tasks", "none", "--valid-prefix", str(tmp_path / "v")],
                                 f"error: --valid-prefix {tmp_path / 'v'}: missing {tmp_path / 'v'}.bin and "
                                 f"{tmp_path / 'v'}.idx; expected P.bin and P.idx written by tools/preprocess_data.py"),
    }


@pytest.mark.parametrize("name", list(_bad_arguments(Path("/x"))))
def test_bad_arguments_give_one_error_line_and_write_nothing(name, tmp_path, capsys):
    args, message = _bad_arguments(tmp_path)[name]
    out = tmp_path / "out"
    assert _eval_loops_main()(["--model", str(hf_assets().exports[MODEL]), "--output", str(out), *args]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]
    assert not out.exists()


def test_compare_of_a_sweep_that_measured_something_else_is_refused_before_the_sweep(tmp_path, capsys):
    """A --limit 20 run is not drawn beside this sweep as if comparable (eval/report.check_comparable)."""
    other = tmp_path / "small_eval"
    other.mkdir()
    (other / "results.json").write_text(json.dumps({"loops": [1], "effective_depth": {"1": 4}, "groups": {},
                                                    "training_depth": 6, "tasks": {"piqa": {"1": 50.0}},
                                                    "limit": 20, "items": {"piqa": 20}}))
    out = tmp_path / "out"
    args = ["--model", str(hf_assets().exports[MODEL]), "--output", str(out), "--loops", "1", "--tasks", "none",
            "--valid-prefix", data_assets().prefix + "_valid", "--compare", str(other)]
    assert _eval_loops_main()(args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --compare {other}: tasks piqa against none here; --limit 20 against None here; expected the same "
        "tasks, --limit and items (or --compare-mismatched to draw them anyway, each run's n on the legend)"]
    assert not out.exists()


def test_default_hub_tasks_offline_name_the_tasks_and_the_local_alternative(local_tasks, tmp_path, capsys,
                                                                           monkeypatch):
    """The default (paper) tasks read hub datasets; offline and uncached they stop the sweep before the
    model is loaded, with one line naming them and how to run local tasks instead."""
    import datasets
    import huggingface_hub

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # what `make test` sets; read at import time
        monkeypatch.setenv(name, "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    out = tmp_path / "out"
    _, include = local_tasks  # the sweep's folders: lm-eval's task index is reused, not rebuilt
    assert _eval_loops_main()(["--model", str(hf_assets().exports[MODEL]), "--loops", "1", *include,
                               "--output", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --tasks: sciq, arc_easy, piqa, arc_challenge, winogrande, openbookqa, hellaswag, "
                           "commonsense_qa, proofwriter, clutrr, bbh need datasets from the Hugging Face hub that are "
                           "not in the local cache, and offline mode is on (HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1)")
    assert line.endswith("; run once with network access to cache them, or evaluate local tasks (--tasks facts,"
                         "clutrr=looplm_clutrr_local,proofwriter=looplm_proofwriter_local,bbh=looplm_tracking_local "
                         "--include-path CORPUS/eval (written by tools/make_corpus.py)), or --tasks none for "
                         "held-out loss only")
    assert not out.exists()
