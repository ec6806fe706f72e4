"""The knowledge/reasoning study at CPU scale (``bash tools/small_study.sh finding1``): its corpus
(stored facts asked as trained, CLUTRR-style kinship chains of depths 1-4 with held-out contexts),
the corpus options it rests on (chained arithmetic held out from depth 3), the seed summary of
``tools/seed_study.py`` (mean and standard error over seeds, tables, figure), and where AdaLN's
W_k^b goes under both readings of the optimizer split."""

from __future__ import annotations

import json
import math
import re
import shlex

import pytest

from data_fixtures import REPO, run_tool
from megatron_loop import registry
from megatron_loop.data.corpus import CorpusSpec, generate_corpus
from megatron_loop.errors import LoopConfigError
from testpaths import load_script

seed_study = load_script("tools/seed_study.py")


def test_study_corpus_asks_the_trained_facts_and_holds_out_long_chains(tmp_path):
    """``knowledge_eval=trained``: the items are exactly the questions train answers (each Q&A
    document ``knowledge_qa_mentions`` times); ``reasoning_tasks`` picks the generators;
    ``eval_min_depth`` starts the held-out items where unseen contexts exist."""
    spec = CorpusSpec(seed=3, prose_docs=0, reasoning_docs_per_task=300, valid_docs=30, eval_items_per_depth=4,
                      train_max_depth=2, eval_min_depth=3, eval_max_depth=4, reasoning_tasks=("arith",),
                      knowledge_people=12, knowledge_mentions=0, knowledge_qa_fraction=1.0,
                      knowledge_eval="trained", knowledge_qa_mentions=5, follow_up_questions=1)
    manifest = generate_corpus(tmp_path, spec)
    read = lambda name: [json.loads(line) for line in (tmp_path / name).open()]  # noqa: E731
    train, valid = read("train.jsonl"), read("valid.jsonl")
    assert {d["source"] for d in train} == {"arith", "facts"} and {d["source"] for d in valid} == {"arith"}
    assert sorted((tmp_path / "eval").glob("*.jsonl")) == [tmp_path / "eval" / "arith.jsonl",
                                                            tmp_path / "eval" / "facts.jsonl"]
    facts = [d for d in train if d["source"] == "facts"]
    assert len(facts) == 12 * 5 and len({d["text"].split("\n")[0] for d in facts}) <= 12 * 3
    train_text = "\n".join(d["text"] for d in facts)
    items = read("eval/facts.jsonl")
    assert len(items) == 12 * 3 == manifest["eval_items"]["looplm_facts_local"]
    for item in items:  # the trained question followed by its gold answer, as lm-eval scores it
        assert train_text.count(f"{item['query']} {item['choices'][item['gold']]}\n") + train_text.count(
            f"{item['query']} {item['choices'][item['gold']]}") >= 5
    arith = read("eval/arith.jsonl")
    assert sorted({d["depth"] for d in arith}) == [3, 4] and len(arith) == 8
    trained = {d["text"].split("\n")[0] for d in train if d["source"] == "arith"}
    assert not any(d["query"].split("\n")[0] in trained for d in arith)  # held out
    assert all(d["choices"] == [str(i) for i in range(10)] for d in arith)
    assert "trained_depths: [1, 2]" in (tmp_path / "eval" / "arith.yaml").read_text()


@pytest.mark.parametrize("change, message", [
    (dict(reasoning_tasks=("nope",)), "reasoning_tasks=nope: expected distinct names"),
    (dict(knowledge_eval="all"), "knowledge_eval='all': expected one of heldout, trained"),
    (dict(knowledge_qa_fraction=1.0), "knowledge_qa_fraction=1.0: expected a share in [0, 1)"),
    (dict(knowledge_eval="trained", knowledge_qa_fraction=0.0), "expected a share in (0, 1]"),
    (dict(eval_min_depth=7), "eval_min_depth=7: expected 1..eval_max_depth (6)"),
])
def test_bad_study_corpus_spec(tmp_path, change, message):
    with pytest.raises(LoopConfigError, match=re.escape(message)):
        generate_corpus(tmp_path, CorpusSpec(**change))
    assert not (tmp_path / "train.jsonl").exists()


def test_make_corpus_cli_takes_the_study_flags(tmp_path):
    """The study's corpus flags (registry) go through tools/make_corpus.py as written: the trained
    facts and the CLUTRR-style chains alone, items at every trained depth (1-4); old flags still work."""
    args = shlex.split(registry.STUDIES["finding1"].corpus_args.replace("20000", "40").replace("150", "6")
                       .replace("--eval-items-per-depth 75", "--eval-items-per-depth 2"))
    r = run_tool("make_corpus.py", "--output-dir", str(tmp_path / "c"), "--seed", "1", *args)
    assert r.returncode == 0, r.stderr
    manifest = json.loads(r.stdout)
    assert manifest["eval_items"] == {"looplm_clutrr_local": 8, "looplm_facts_local": 18}
    assert manifest["spec"]["knowledge_eval"] == "trained" and manifest["spec"]["reasoning_tasks"] == ["clutrr"]
    train = [json.loads(line) for line in (tmp_path / "c" / "train.jsonl").open()]
    assert {d["source"] for d in train} == {"clutrr", "facts"}
    assert {d["depth"] for d in train if d["source"] == "clutrr"} == {1, 2, 3, 4}
    items = [json.loads(line) for line in (tmp_path / "c" / "eval" / "clutrr.jsonl").open()]
    assert sorted(d["depth"] for d in items) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert all(len(d["choices"]) == 4 for d in items)  # chance 25 %
    trained = {d["text"].split("\nQuestion")[0] for d in train if d["source"] == "clutrr"}
    assert not any(d["query"].split("\nQuestion")[0] in trained for d in items)  # held-out contexts
    bad = run_tool("make_corpus.py", "--output-dir", str(tmp_path / "d"), "--reasoning-tasks", "clutrr,nope")
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith("error: reasoning_tasks=")


def _results(layout: str, loops: list[int], depth: dict, knowledge: list[float], reasoning: list[float],
             loss: list[float]) -> dict:
    keys = [str(r) for r in loops]
    return {"layout": layout, "loops": loops, "training_depth": depth["K"],
            "effective_depth": {k: depth[k] for k in keys},
            "groups": {"knowledge": dict(zip(keys, knowledge)), "reasoning": dict(zip(keys, reasoning)),
                       "overall": {k: (a + b) / 2 for k, a, b in zip(keys, knowledge, reasoning)}},
            "groups_chance": {"knowledge": 25.0, "reasoning": 25.0, "overall": 25.0},
            "heldout": {k: {"loss": x} for k, x in zip(keys, loss)},
            "per_depth": {"clutrr": {k: {"3": {"accuracy": x}} for k, x in zip(keys, reasoning)}}}  # r -> depth


def test_seed_summary_means_and_standard_errors(tmp_path, capsys):
    """Mean and sd / sqrt(n) (sd with n - 1) over the seeds' results.json, per model and L(r);
    the tables mark L(K); the figure is written; a missing seed is one error line."""
    study = registry.STUDIES["finding1"]
    values = {1: (30.0, 12.0), 2: (36.0, 18.0), 3: (33.0, 21.0)}
    for seed, (know, reason) in values.items():
        for toy in study.toys():
            p, s, k, c = toy.layout
            loops = list(range(1, 2 * k + 1)) if k > 1 else [1]
            depth = {str(r): p + r * s + c for r in loops} | {"K": p + k * s + c}
            folder = tmp_path / f"{toy.name}-seed{seed}" / "eval"
            folder.mkdir(parents=True)
            shift = 10.0 if toy.name == "nonloop_6x1" else 0.0
            result = _results(f"{p}+{s}x{k}+{c}", loops, depth, [know + shift] * len(loops),
                              [reason + r for r in loops], [1.0 + seed / 10] * len(loops))
            (folder / "results.json").write_text(json.dumps(result))
    assert seed_study.main(["--study", "finding1", "--run", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    loop = summary["models"]["baseloop_2x3"]
    assert loop["effective_depth"] == [2, 4, 6, 8, 10, 12] and loop["seeds"] == 3
    se = math.sqrt(((30 - 33) ** 2 + (36 - 33) ** 2 + 0) / 2 / 3)  # sd (n - 1) / sqrt(3) = sqrt(3)
    assert loop["knowledge"][2]["mean"] == pytest.approx(33.0) and loop["knowledge"][2]["se"] == pytest.approx(se)
    assert loop["reasoning"][5]["mean"] == pytest.approx(17.0 + 6) and loop["reasoning"][5]["values"] == [18, 24, 27]
    assert summary["models"]["nonloop_6x1"]["knowledge"][0]["mean"] == pytest.approx(43.0)
    assert loop["heldout_loss"][0]["mean"] == pytest.approx(1.2)
    table = (tmp_path / "summary.md").read_text()
    assert "| `baseloop_2x3` (0+2x3+0, 3 seeds) | 33.0 ± 1.7 | 33.0 ± 1.7 | **33.0 ± 1.7** | 33.0 ± 1.7 |" in table
    assert "| `baseloop_2x3` (L = 6) | 20.0 ± 2.6 |" in table  # clutrr by depth, at r = K
    assert (tmp_path / "knowledge_reasoning_vs_depth.png").stat().st_size > 10_000
    capsys.readouterr()
    (tmp_path / "nonloop_6x1-seed2" / "eval" / "results.json").unlink()
    assert seed_study.main(["--study", "finding1", "--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path}/nonloop_6x1-seed2/eval/results.json: missing; run bash "
                   "tools/small_study.sh finding1 first"]
    assert seed_study.main(["--study", "toy", "--run", str(tmp_path)]) == 2
    assert "expected a study with seeds (finding1)" in capsys.readouterr().err


def test_adaln_weight_stays_on_adamw_under_both_readings():
    """App. C.2 vs Sec. 2.2 move only the dense injection matrices; AdaLN's W_k^b (2d x 8, on the
    timestep features) is AdamW either way."""
    from megatron_loop import build_model
    from megatron_loop.config import build_model_config
    from megatron_loop.optim.optimizer import role_param_groups

    fields = dict(backbone="tiny-llama", core_layers=2, train_loops=3, timestep="adaln", initial_injection="dense")
    model = build_model(build_model_config(fields))
    adaln = {id(p) for n, p in model.named_parameters() if "adaln" in n}
    dense = {id(p) for n, p in model.named_parameters() if "initial_injection" in n}
    assert len(adaln) == 4 and len(dense) == 1
    for flag in (False, True):
        groups = {g["name"]: {id(p) for p in g["params"]} for g in role_param_groups(model, "muon_adamw", flag)}
        assert adaln <= groups["adamw"] and not adaln & groups["muon"]
        assert (dense <= groups["muon"]) == flag
