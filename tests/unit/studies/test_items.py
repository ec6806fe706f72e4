"""The registered studies' items measure what they claim (issue 42 item 2): generated from the plans' own
corpus flags by tools/make_corpus.py, the in-horizon compose items' queries occur in no training or
validation document, the beyond items' depths are never trained, every depth-1 item is a trained table entry,
the facts are asked in a paraphrase their biographies never use, and the in-context control's people are
outside the knowledge population and its training names (the trivial baselines: test_baselines.py)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from data_fixtures import run_tool
from megatron_loop.data.corpus_templates import COMPOSE_MOVES
from megatron_loop.studies import PLANS


def _read(path):
    return [json.loads(line) for line in path.open()]


@pytest.fixture(scope="module")
def plan_corpus(tmp_path_factory):
    """The corpus every registered plan names (they share one), generated as tools/small_study.sh does."""
    args = {plan.corpus_args for plan in PLANS.values()}
    assert len(args) == 1
    out = tmp_path_factory.mktemp("plan_corpus") / "corpus"
    done = run_tool("make_corpus.py", "--output-dir", str(out), "--seed", "0", *shlex.split(args.pop()))
    assert done.returncode == 0, done.stderr
    return out


def test_in_horizon_items_never_occur_in_training(plan_corpus):
    train, valid = _read(plan_corpus / "train.jsonl"), _read(plan_corpus / "valid.jsonl")
    items = _read(plan_corpus / "eval" / "compose.jsonl")
    texts = [d["text"] for d in train + valid]
    answered = {d["text"].rsplit(" ", 1)[0] for d in train + valid if d["source"] == "compose"}  # "3 f g ="
    by_split = {s: [d for d in items if d["split"] == s] for s in ("seen", "in_horizon", "beyond")}
    assert [len(by_split[s]) for s in ("seen", "in_horizon", "beyond")] == [50, 300, 400]
    assert sorted({d["depth"] for d in by_split["in_horizon"]}) == [2, 3, 4]
    assert sorted({d["depth"] for d in by_split["beyond"]}) == [5, 6]
    # the string test: no in-horizon query is a substring of any training or validation document
    joined = "\n".join(texts)
    assert not [d["query"] for d in by_split["in_horizon"] if d["query"] in joined]
    assert all(d["query"] in answered for d in by_split["seen"])  # the tables: every context trained
    assert max(d["depth"] for d in train if d["source"] == "compose") == 4  # nothing beyond is trained
    for d in items:  # the gold answers compose the moves
        start, moves = re.fullmatch(r"(\d) ([a-z ]+) =", d["query"]).groups()
        value = int(start)
        for move in moves.split():
            value = COMPOSE_MOVES[move][value]
        assert d["choices"][d["gold"]] == str(value)


def test_knowledge_and_control_items(plan_corpus):
    train = _read(plan_corpus / "train.jsonl")
    facts, book = _read(plan_corpus / "eval" / "facts.jsonl"), _read(plan_corpus / "eval" / "openbook.jsonl")
    assert len(facts) == 600 and len(book) == 300
    bios = [d["text"] for d in train if d["source"] == "facts"]
    sentences = {s for b in bios for s in re.split(r"(?<=\.) ", b)}
    assert not [f for f in facts if any(s.startswith(f["query"] + " ") for s in sentences)]
    population = {f["person"] for f in facts}
    control_train = [d["text"] for d in train if d["source"] == "openbook"]
    assert len(control_train) == 3000
    trained_names = {" ".join(t.split()[:2]) for t in control_train}
    assert not ({b["person"] for b in book} & (population | trained_names))
    for b in book:  # the answer is in the prompt, stated in a different paraphrase than the one asked
        gold = b["choices"][b["gold"]]
        context, asked = b["query"].rsplit(". ", 1)
        assert f" {gold}." in " " + context + "." and b["person"] in asked
