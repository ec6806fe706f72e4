"""Generated corpus: determinism, held-out split, answers checked by independent solvers, the
knowledge items answerable only from training documents, lm-eval task files, and the
corpus/tokenizer CLIs."""

from __future__ import annotations

import json
import random
import re

import pytest

from data_fixtures import data_assets, run_tool
from megatron_loop.data.corpus import CorpusSpec, generate_corpus
from megatron_loop.data.corpus_knowledge import KNOWLEDGE_ATTRIBUTES
from megatron_loop.data.corpus_templates import FEMALE_NAMES, GENERATORS, KNOWLEDGE_TASK, TASK_NAMES, TASKS
from megatron_loop.errors import LoopConfigError


def _solve_tracking(query: str) -> str:
    start = re.search(r"At the start, (.*?)\.", query).group(1)
    holding = dict(re.findall(r"(\w+) has an? ([\w ]+?)(?:,|$)", start))
    for a, b in re.findall(r"Then (\w+) and (\w+) swap", query):
        holding[a], holding[b] = holding[b], holding[a]
    target = re.search(r"what does (\w+) have\?", query).group(1)
    return holding[target]


def _solve_proofwriter(query: str) -> str:
    facts = set(re.findall(r"(\w+) is (\w+)\.", query))
    rules = re.findall(r"If someone is (\w+) then they are (\w+)\.", query)
    changed = True
    while changed:  # forward chaining to a fixed point
        changed = False
        for entity, attr in list(facts):
            for pre, post in rules:
                if attr == pre and (entity, post) not in facts:
                    facts.add((entity, post))
                    changed = True
    entity, attr = re.search(r'statement "(\w+) is (\w+)"', query).groups()
    return "True" if (entity, attr) in facts else "False"


def _solve_clutrr(query: str) -> str:
    edges = {}  # person -> (relative, relation word)
    for rel_person, word, person in re.findall(r"(\w+) is the (\w+) of (\w+)\.", query):
        edges[person] = (rel_person, word)
    for person, word, rel_person in re.findall(r"(\w+)'s (\w+) is (\w+)\.", query):
        edges[person] = (rel_person, word)
    target, source = re.search(r"How is (\w+) related to (\w+)\?", query).groups()
    hops, person, word = 0, source, None
    while person != target:
        person, word = edges[person]
        hops += 1
    base = {"mother": "mother", "father": "father", "son": "son", "daughter": "daughter"}[word]
    return base if hops == 1 else "great-" * (hops - 2) + "grand" + base


def _solve_arith(query: str) -> str:
    value = int(re.search(r"Start with (\d)", query).group(1))
    steps = re.findall(r"then (plus|times) (\d)", query)
    upto = int(re.search(r"after step (\d+)\?", query).group(1))
    for op, n in steps[:upto]:
        value = value + int(n) if op == "plus" else value * int(n)
    return str(value % 10)


def _solve_pointer(query: str) -> str:
    values = dict(re.findall(r" (\w) = (\w)\.", query.split("\nQuestion:")[0]))
    var = re.search(r"What is (\w)\?", query).group(1)
    while not var.isdigit():
        var = values[var]
    return var


def _solve_compose(query: str) -> str:
    from megatron_loop.data.corpus_templates import COMPOSE_MOVES

    start, moves = re.fullmatch(r"(\d) ([a-z ]+) =", query).groups()
    value = int(start)
    for move in moves.split():
        value = COMPOSE_MOVES[move][value]
    return str(value)


SOLVERS = {"tracking": _solve_tracking, "proofwriter": _solve_proofwriter, "clutrr": _solve_clutrr,
           "arith": _solve_arith, "pointer": _solve_pointer, "compose": _solve_compose}


@pytest.mark.parametrize("task", sorted(GENERATORS))
def test_generated_answers_match_independent_solver(task):
    """Main and follow-up answers (the further questions of training documents) alike."""
    rng = random.Random(0)
    for depth in range(1, 8):
        for _ in range(30):
            item = GENERATORS[task](rng, depth)
            assert item.depth == depth
            assert SOLVERS[task](item.query) == item.choices[item.gold]
            assert len(set(item.choices)) == len(item.choices) >= 2
            # a one-hop chain / one-step computation has no intermediate; compose has no follow-ups
            assert item.follow_ups or (task in ("clutrr", "arith") and depth == 1) or task == "compose"
            assert len({q for q, _ in item.follow_ups}) == len(item.follow_ups)
            for question, answer in item.follow_ups:
                assert question != item.question
                assert SOLVERS[task](f"{item.context}\nQuestion: {question}\nAnswer:") == answer
            text = item.training_text(follow_ups=2)
            assert text.startswith(f"{item.query} {item.choices[item.gold]}")
            if task == "compose":
                assert text == f"{item.query} {item.choices[item.gold]}" and item.choices == tuple("0123456789")
            else:
                assert text.count("\nAnswer: ") == 1 + min(2, len(item.follow_ups))


def test_clutrr_answer_gender_follows_last_person():
    rng = random.Random(1)
    for _ in range(50):
        item = GENERATORS["clutrr"](rng, 3)
        last = re.search(r"How is (\w+) related", item.query).group(1)
        answer = item.choices[item.gold]
        assert answer.endswith(("mother", "daughter")) == (last in FEMALE_NAMES)


def asked_about(question: str) -> str | None:
    """The person a knowledge question names (None for any other text)."""
    m = re.search(r"Question: In which (?:year|city) (?:was|did) (\w+ \w+) (?:born|grow up)\?"
                  r"|Question: Which company does (\w+ \w+) work for\?", question)
    return m and (m.group(1) or m.group(2))


def test_knowledge_items_answerable_only_from_training_documents(tmp_path):
    """Every fact a knowledge item asks about is stated in train (consistently, in a sentence that
    names the person), never in the prompt, in valid or in any other eval prompt; the question
    itself never occurs in train. Checked on the text, independently of the generator's records."""
    spec = CorpusSpec(seed=5, prose_docs=20, reasoning_docs_per_task=10, valid_docs=200,
                      eval_items_per_depth=2, train_max_depth=2, eval_max_depth=2,
                      knowledge_people=40, knowledge_mentions=3, knowledge_qa_fraction=0.5)
    generate_corpus(tmp_path, spec)
    read = lambda name: [json.loads(line) for line in (tmp_path / name).open()]  # noqa: E731
    train, valid, items = read("train.jsonl"), read("valid.jsonl"), read("eval/facts.jsonl")
    train_sentences = [s for d in train for s in re.split(r"(?<=[.?])\s+|\n", d["text"])]
    valid_text = "\n".join(d["text"] for d in valid)
    other_prompts = [d["query"] for t in ("clutrr", "proofwriter", "tracking")
                     for d in read(f"eval/{t}.jsonl")]
    assert len(items) == 20 * 3 and any(d["source"] == "facts" for d in valid)
    for item in items:
        name = asked_about(item["query"])
        gold = item["choices"][item["gold"]]
        assert len(item["choices"]) == 4 and len(set(item["choices"])) == 4
        assert not any(c in item["query"] for c in item["choices"])  # the prompt names only the person
        about = [s for s in train_sentences if name in s]
        assert sum(gold in s for s in about) >= spec.knowledge_mentions  # every biography states it
        for wrong in set(item["choices"]) - {gold}:
            assert not any(wrong in s for s in about)  # no training sentence supports a distractor
        assert name not in valid_text  # validation has other people
        assert not any(name in p for p in other_prompts)
        assert item["query"] not in "\n".join(train_sentences)  # a held-out question
        assert item["query"].split("\n")[0] not in train_sentences
    # the Q&A of the other half of the population is in train (it teaches the question form)
    asked = {asked_about(s) for s in train_sentences if asked_about(s)}
    assert len(asked) == 20 and asked.isdisjoint({d["person"] for d in items})


def test_corpus_files_deterministic_and_held_out(tmp_path):
    spec = CorpusSpec(seed=3, prose_docs=50, reasoning_docs_per_task=40, valid_docs=20,
                      eval_items_per_depth=5, train_max_depth=2, eval_max_depth=3, follow_up_questions=1,
                      knowledge_people=10, knowledge_mentions=2, knowledge_qa_fraction=0.4)
    m1 = generate_corpus(tmp_path / "a", spec)
    generate_corpus(tmp_path / "b", spec)
    generate_corpus(tmp_path / "c", CorpusSpec(**{**spec.__dict__, "seed": 4}))
    names = ["train.jsonl", "valid.jsonl", "eval/clutrr.jsonl", "eval/proofwriter.jsonl", "eval/tracking.jsonl",
             "eval/facts.jsonl"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    train = [json.loads(line) for line in (tmp_path / "a" / "train.jsonl").open()]
    assert len(train) == m1["train_documents"] == 50 + 3 * 40 + 10 * 2 + 4  # prose, reasoning, biographies, Q&A
    assert {d["source"] for d in train} == {"prose", "clutrr", "proofwriter", "tracking", "facts"}
    assert max(d["depth"] for d in train) == 2
    train_text = "\n".join(d["text"] for d in train)
    for task in ("clutrr", "proofwriter", "tracking"):
        docs = [json.loads(line) for line in (tmp_path / "a" / "eval" / f"{task}.jsonl").open()]
        assert len(docs) == 15 == m1["eval_items"][TASK_NAMES[task]]
        assert sorted({d["depth"] for d in docs}) == [1, 2, 3]
        # depths are interleaved so that lm-eval's --limit (first N documents) covers all of them
        assert [d["depth"] for d in docs[:6]] == [1, 2, 3, 1, 2, 3]
        for d in docs:
            assert set(d) == {"query", "choices", "gold", "depth", "task"}
            assert d["query"].endswith("\nAnswer:") and 0 <= d["gold"] < len(d["choices"])
            assert d["query"].split("\nQuestion:")[0] not in train_text  # held out: not even the context
    facts = [json.loads(line) for line in (tmp_path / "a" / "eval" / "facts.jsonl").open()]
    assert len(facts) == 6 * 3 == m1["eval_items"]["looplm_facts_local"]  # the 6 people without Q&A in train
    assert [d["attribute"] for d in facts[:3]] == sorted(KNOWLEDGE_ATTRIBUTES)  # interleaved for --limit
    assert "trained_depths: [1, 2]" in (tmp_path / "a" / "eval" / "tracking.yaml").read_text()
    assert "trained_depths" not in (tmp_path / "a" / "eval" / "facts.yaml").read_text()  # facts have no depth


def test_default_corpus_is_a_few_megabytes(tmp_path):
    generate_corpus(tmp_path, CorpusSpec())
    size = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert 1_000_000 < size < 5_000_000


def test_bad_spec_rejected(tmp_path):
    with pytest.raises(LoopConfigError, match="depths must be >= 1"):
        generate_corpus(tmp_path, CorpusSpec(train_max_depth=0))


def test_lm_eval_loads_local_tasks(monkeypatch, tmp_path):
    import datasets
    from lm_eval.tasks import TaskManager

    # Keep the arrow cache of the local json files out of the user's ~/.cache.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    a = data_assets()
    tm = TaskManager(include_path=str(a.corpus / "eval"), include_defaults=False)
    # the default corpus's tasks: the three reasoning generators and facts (arith only on request)
    assert {TASK_NAMES[t] for t in (*TASKS, KNOWLEDGE_TASK)} <= set(tm.all_tasks)
    assert TASK_NAMES["arith"] not in tm.all_tasks
    task = tm.load_task_or_group(["looplm_tracking_local"])["looplm_tracking_local"]
    docs = list(task.test_docs())
    assert len(docs) == 8 * 4
    doc = docs[0]
    assert task.doc_to_text(doc) == doc["query"]
    assert task.doc_to_choice(doc) == doc["choices"]
    assert task.doc_to_target(doc) == doc["gold"]
    assert task.OUTPUT_TYPE == "multiple_choice"


def test_make_corpus_and_train_tokenizer_clis(tmp_path):
    r = run_tool("make_corpus.py", "--output-dir", str(tmp_path / "c"), "--prose-docs", "40",
                 "--reasoning-docs-per-task", "20", "--valid-docs", "10", "--eval-items-per-depth", "2",
                 "--knowledge-people", "10", "--knowledge-mentions", "2", "--knowledge-qa-fraction", "0.3")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["train_documents"] == 40 + 3 * 20 + 10 * 2 + 3  # prose, reasoning, biographies, Q&A
    assert json.loads(r.stdout)["eval_items"]["looplm_facts_local"] == 7 * 3
    r = run_tool("train_tokenizer.py", "--input", str(tmp_path / "c" / "train.jsonl"),
                 "--output", str(tmp_path / "tok"), "--vocab-size", "400")
    assert r.returncode == 0, r.stderr
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert tok.eos_token == "<|endoftext|>" and len(tok) <= 400
    text = "Alice has a red ball.\n  Then   Bob swaps."
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    bad = run_tool("make_corpus.py", "--output-dir", str(tmp_path / "d"), "--eval-max-depth", "0")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: corpus depths must be >= 1")


def test_paired_study_corpus(tmp_path):
    """finding1_paired's corpus: compose items with digit answers at depths 1-6 (depths 1-4 trained,
    every context of them in the training (or validation) documents and marked ``seen``, depths 5-6
    never), and the facts asked in
    the paraphrase each person's biographies never use: every fact stated in exactly
    ``knowledge_mentions`` biographies, in the other paraphrases, and the item's query nowhere in train."""
    spec = CorpusSpec(seed=2, prose_docs=0, reasoning_tasks=("compose",), reasoning_docs_per_task=3000,
                      train_max_depth=4, eval_max_depth=6, eval_items_per_depth=50, valid_docs=40,
                      knowledge_people=30, knowledge_mentions=5, knowledge_qa_fraction=0.0, knowledge_eval="template")
    manifest = generate_corpus(tmp_path, spec)
    read = lambda name: [json.loads(line) for line in (tmp_path / name).open()]  # noqa: E731
    train, items, facts = read("train.jsonl"), read("eval/compose.jsonl"), read("eval/facts.jsonl")
    contexts = {d["text"].rsplit(" ", 1)[0] for d in train + read("valid.jsonl") if d["source"] == "compose"}
    by_depth = {h: [d for d in items if d["depth"] == h] for h in range(1, 7)}
    assert [len(by_depth[h]) for h in range(1, 7)] == [30, 50, 50, 50, 50, 50]  # depth 1 has 10 x 3 contexts
    for h, docs in by_depth.items():
        assert len({d["query"] for d in docs}) == len(docs)
        assert all(d["seen"] == (d["query"] in contexts) for d in docs)
        assert all(d["choices"] == [str(i) for i in range(10)] and _solve_compose(d["query"]) == str(d["gold"])
                   for d in docs)
    assert not any(d["seen"] for d in by_depth[5] + by_depth[6])
    assert manifest["eval_items"] == {"looplm_compose_local": 280, "looplm_facts_local": 90}
    bios = [d["text"] for d in train if d["source"] == "facts"]
    assert len(bios) == 30 * 5 and not any("Question" in b for b in bios)
    sentences = [s for b in bios for s in re.split(r"(?<=\.) ", b)]
    for item in facts:
        gold = item["choices"][item["gold"]]
        stated = [s for s in sentences if item["person"] in s and gold in s]
        assert len(stated) == item["exposures"] == 5  # every biography states it once
        assert not any(s.startswith(item["query"] + " ") for s in sentences)  # never in the held-out paraphrase
        assert item["person"] in item["query"] and len(set(item["choices"])) == 4


@pytest.mark.parametrize("kind, kwargs, digest", [
    ("demo", dict(seed=0, prose_docs=60, reasoning_docs_per_task=25, valid_docs=40, eval_items_per_depth=6,
                  train_max_depth=2, eval_max_depth=3, knowledge_people=12),
     "7ac382d4777fdc96476e83564ee11e1f13a31875deee8b299dbc28b81f7b1a96"),
    ("finding1", dict(seed=0, prose_docs=0, reasoning_tasks=("clutrr",), reasoning_docs_per_task=40, valid_docs=30,
                      eval_items_per_depth=5, train_max_depth=4, eval_max_depth=4, knowledge_people=10,
                      knowledge_mentions=0, knowledge_qa_fraction=1.0, knowledge_eval="trained",
                      knowledge_qa_mentions=3),
     "68972e6b521e67f19786cd3fa2ffb2845c8707ae83d0957094772768747cb754"),
])
def test_existing_corpora_are_byte_identical(tmp_path, kind, kwargs, digest):
    """The generators added for finding1_paired (compose, pointer, held-out-template knowledge) leave
    every existing corpus as it was: the demo's kind (prose, the three default generators, held-out
    knowledge) and finding1's (kinship chains, trained facts), at small sizes, hash to what the
    generator wrote before them (the demo's scores in the docs depend on its corpus)."""
    import hashlib

    generate_corpus(tmp_path, CorpusSpec(**kwargs))
    h = hashlib.sha256()
    for path in sorted(tmp_path.rglob("*.jsonl")):
        h.update(path.relative_to(tmp_path).as_posix().encode())
        h.update(path.read_bytes())
    assert h.hexdigest() == digest, kind
