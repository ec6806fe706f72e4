"""A small, licence-clean corpus generated from templates, with depth-controlled reasoning.

The paper pretrains on FineWeb-Edu (App. C.1) and measures reasoning on ProofWriter, CLUTRR
and BBH ``tracking_shuffled_objects`` (App. C.3, Table 5), the three tasks whose
difficulty is set by an explicit compositional parameter. Nothing here is downloaded: prose is
built from word lists, and the three reasoning generators mirror those tasks (both in
:mod:`megatron_loop.data.corpus_templates`; the knowledge items in ``corpus_knowledge``) with a ``depth`` knob (chain length, proof depth, number of swaps), so a tiny model trained
on CPU can show accuracy by depth and loop count. Everything is deterministic given a seed
(``random.Random`` seeded with a string uses SHA-512, not Python's salted ``hash``).

Generated text is original and released with the repository (Apache-2.0).
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from megatron_loop.atomic import write_atomic
from megatron_loop.data.corpus_knowledge import (Person, all_names, make_people, open_book, open_book_doc,
                                                 random_person)
from megatron_loop.data.corpus_templates import (COMPOSE_MOVE_NAMES, COMPOSE_TASK, CONTROL_TASK, FINITE_TASKS,
                                                 GENERATORS, KNOWLEDGE_EVAL, KNOWLEDGE_TASK, TASK_NAMES, TASKS,
                                                 ReasoningItem, make_prose)
from megatron_loop.errors import LoopConfigError


@dataclass(frozen=True)
class CorpusSpec:
    """Sizes and depth ranges of a generated corpus (defaults: about 3 MB of text)."""

    seed: int = 0
    prose_docs: int = 3000
    reasoning_docs_per_task: int = 2000
    valid_docs: int = 300
    eval_items_per_depth: int = 100
    train_max_depth: int = 4
    eval_max_depth: int = 6
    # Held-out items from this depth on (a task whose short chains are all in train, as the
    # 120 one-step arith contexts, has none to hold out below it).
    eval_min_depth: int = 1
    # Reasoning: further questions about the same context in each training document.
    follow_up_questions: int = 0
    # Knowledge: population size (train people; validation gets its own, disjoint ones),
    # biographies per person in train, and the share of people whose Q&A is also in train
    # (the others' questions are the held-out knowledge items).
    knowledge_people: int = 200
    knowledge_mentions: int = 8
    knowledge_qa_fraction: float = 0.5
    # Which reasoning generators make the training documents and eval tasks (GENERATORS keys).
    reasoning_tasks: tuple[str, ...] = TASKS
    # Knowledge items: "heldout" asks about the people whose Q&A is not in train (recall from
    # biographies through an unseen question form); "trained" asks the Q&A people's questions,
    # whose answers train states ``knowledge_qa_mentions`` times (storage of facts as such,
    # the quantity that grows with parameters); "template" asks every person's facts, each in the
    # biography paraphrase held out from that person's ``knowledge_mentions`` biographies (no Q&A:
    # ``knowledge_qa_fraction`` 0), so each fact is seen exactly ``knowledge_mentions`` times per
    # epoch and asked in a form never seen with it (closed-book recall).
    knowledge_eval: str = "heldout"
    knowledge_qa_mentions: int = 1
    # compose: how many move permutations (10 x compose_moves^h contexts at depth h)
    compose_moves: int = 3
    # Held-out contexts of the trained depths (FINITE_TASKS): at every depth 2..train_max_depth this many
    # contexts are drawn first and never written into train or valid; they are that depth's eval items
    # (``split`` in_horizon), so an item of a trained depth is a composition never seen answered.
    held_out_contexts: int = 0
    # The in-context control (``openbook``, corpus_knowledge.open_book): training documents and eval items,
    # fresh people outside the knowledge population (the eval's names disjoint from the training ones).
    control_docs: int = 0
    control_items: int = 0

    def validate(self) -> None:
        if self.train_max_depth < 1 or self.eval_max_depth < 1:
            raise LoopConfigError("corpus depths must be >= 1 (train_max_depth, eval_max_depth)")
        if not 1 <= self.eval_min_depth <= self.eval_max_depth:
            raise LoopConfigError(f"eval_min_depth={self.eval_min_depth}: expected 1..eval_max_depth "
                                  f"({self.eval_max_depth})")
        if min(self.prose_docs, self.reasoning_docs_per_task, self.valid_docs,
               self.eval_items_per_depth, self.follow_up_questions, self.knowledge_people,
               self.knowledge_mentions, self.knowledge_qa_mentions) < 0:
            raise LoopConfigError("corpus document counts must be >= 0")
        unknown = [t for t in self.reasoning_tasks if t not in GENERATORS]
        if unknown or len(set(self.reasoning_tasks)) != len(self.reasoning_tasks):
            raise LoopConfigError(f"reasoning_tasks={','.join(self.reasoning_tasks)}: expected distinct "
                                  f"names among {', '.join(GENERATORS)}")
        if not 1 <= self.compose_moves <= len(COMPOSE_MOVE_NAMES):
            raise LoopConfigError(f"compose_moves={self.compose_moves}: expected 1..{len(COMPOSE_MOVE_NAMES)}")
        if min(self.held_out_contexts, self.control_docs, self.control_items) < 0:
            raise LoopConfigError("held_out_contexts, control_docs and control_items must be >= 0")
        if self.held_out_contexts and COMPOSE_TASK in self.reasoning_tasks:
            fewest = 10 * self.compose_moves ** 2  # depth 2, the smallest depth with held-out contexts
            if 2 * self.held_out_contexts > fewest:
                raise LoopConfigError(f"held_out_contexts={self.held_out_contexts}: expected at most half of the "
                                      f"{fewest} depth-2 compose contexts (compose_moves={self.compose_moves}); "
                                      "the rest must be trained")
        if self.knowledge_eval not in KNOWLEDGE_EVAL:
            raise LoopConfigError(f"knowledge_eval={self.knowledge_eval!r}: expected one of "
                                  f"{', '.join(KNOWLEDGE_EVAL)}")
        if self.knowledge_eval == "heldout" and not 0.0 <= self.knowledge_qa_fraction < 1.0:
            raise LoopConfigError(f"knowledge_qa_fraction={self.knowledge_qa_fraction}: expected a "
                                  "share in [0, 1) (the rest are the held-out knowledge items)")
        if self.knowledge_eval == "trained" and not 0.0 < self.knowledge_qa_fraction <= 1.0:
            raise LoopConfigError(f"knowledge_qa_fraction={self.knowledge_qa_fraction}: expected a "
                                  "share in (0, 1] with knowledge_eval=trained (the Q&A people are the items)")
        if self.knowledge_eval == "template" and (self.knowledge_qa_fraction != 0.0 or self.knowledge_mentions < 1):
            raise LoopConfigError(f"knowledge_eval=template with knowledge_qa_fraction={self.knowledge_qa_fraction}, "
                                  f"knowledge_mentions={self.knowledge_mentions}: expected knowledge_qa_fraction 0 "
                                  "(no Q&A documents) and knowledge_mentions >= 1 (the facts' only exposures)")


def generator(task: str, spec: CorpusSpec):
    """The item generator of ``task`` in this corpus (compose with ``spec.compose_moves`` moves)."""
    if task == COMPOSE_TASK:
        return functools.partial(GENERATORS[task], moves=spec.compose_moves)
    return GENERATORS[task]


def _documents(rng: random.Random, spec: CorpusSpec, n_prose: int, n_reasoning: int,
               bios: list[Person], mentions: int, qa: list[Person],
               contexts: set[str], held_out: dict[str, dict[str, int]] | None = None,
               exclude: frozenset[str] = frozenset(), control: tuple[int, list[str], str] = (0, [], "")) -> list[dict]:
    """Mixed prose, reasoning (depths uniform in 1..train_max_depth; a context in ``exclude`` is drawn
    again), ``mentions`` biographies of every person in ``bios`` (without the paraphrases ``held_out``
    names for them), the Q&A of every person in ``qa`` and ``control`` = (count, names, rng key) in-context
    control documents; adds the reasoning contexts to ``contexts``. Knowledge documents have source
    "facts", depth 0."""
    docs = [{"text": make_prose(rng), "source": "prose", "depth": 0} for _ in range(n_prose)]
    for task in spec.reasoning_tasks:
        make = generator(task, spec)
        for _ in range(n_reasoning):
            depth = rng.randint(1, spec.train_max_depth)
            item = make(rng, depth)
            while item.context in exclude:
                item = make(rng, depth)
            contexts.add(item.context)
            docs.append({"text": item.training_text(spec.follow_up_questions), "source": task,
                         "depth": item.depth})
    docs += [{"text": p.biography(rng, (held_out or {}).get(p.name)), "source": "facts", "depth": 0}
             for p in bios for _ in range(mentions)]
    docs += [{"text": p.qa_text(rng), "source": "facts", "depth": 0}
             for p in qa for _ in range(spec.knowledge_qa_mentions)]
    count, names, key = control
    if count:  # its own stream: the other documents are the same with or without the control
        crng = random.Random(key)
        for _ in range(count):
            query, value, _ = open_book(random_person(crng, names), crng)
            docs.append({"text": f"{query} {value}.", "source": CONTROL_TASK, "depth": 0})
    rng.shuffle(docs)
    return docs


def held_out_items(task: str, spec: CorpusSpec) -> dict[int, list[ReasoningItem]]:
    """The contexts of the trained depths 2..train_max_depth kept out of training (``held_out_contexts``
    per depth, distinct), drawn before any training document: {depth: items}. Empty unless the task is
    one of the FINITE_TASKS and the spec asks for them."""
    if not spec.held_out_contexts or task not in FINITE_TASKS:
        return {}
    rng, make = random.Random(f"{spec.seed}-held-out-{task}"), generator(task, spec)
    out: dict[int, list[ReasoningItem]] = {}
    for depth in range(2, spec.train_max_depth + 1):
        drawn: dict[str, ReasoningItem] = {}
        while len(drawn) < spec.held_out_contexts:
            item = make(rng, depth)
            drawn.setdefault(item.context, item)
        out[depth] = list(drawn.values())
    return out


def _eval_items(task: str, spec: CorpusSpec, seen: set[str],
                held: dict[int, list[ReasoningItem]] | None = None) -> Iterator[tuple[ReasoningItem, bool]]:
    """Held-out items, ``eval_items_per_depth`` per depth, with whether their context is in training:
    a context seen in training is skipped, except for the FINITE_TASKS, whose items are distinct
    contexts whether seen or not (as many as the depth has, up to ``eval_items_per_depth``); at a depth
    of ``held`` (held_out_items) the items are its held-out contexts."""
    rng, make = random.Random(f"{spec.seed}-eval-{task}"), generator(task, spec)
    finite = task in FINITE_TASKS
    for depth in range(spec.eval_min_depth, spec.eval_max_depth + 1):
        if held and depth in held:
            yield from ((item, False) for item in held[depth])
            continue
        made, attempts, drawn = 0, 0, set()
        while made < spec.eval_items_per_depth:
            attempts += 1
            if attempts > 100 * max(1, spec.eval_items_per_depth):
                if finite:
                    break  # every context of this depth drawn
                raise LoopConfigError(
                    f"cannot draw {spec.eval_items_per_depth} distinct held-out {task} items at "
                    f"depth {depth}; lower eval_items_per_depth")
            item = make(rng, depth)
            if item.context in drawn or (item.context in seen and not finite):
                continue
            drawn.add(item.context)
            made += 1
            yield item, item.context in seen


def _split(depth: int, seen: bool, spec: CorpusSpec) -> str:
    """What an item of a corpus with held-out contexts measures: ``seen`` (its context is trained: depth 1,
    the moves' tables), ``in_horizon`` (a trained depth, context held out of training) or ``beyond`` (a depth
    past train_max_depth, never trained)."""
    if depth > spec.train_max_depth:
        return "beyond"
    return "seen" if seen else "in_horizon"


def _interleave(rows: list[dict], key: str = "depth") -> list[dict]:
    """Round-robin over the values of ``key`` (depths 1, 2, ..., D, 1, 2, ...; attributes) so
    that lm-eval's ``--limit N``, which keeps the first N documents, covers every stratum evenly."""
    strata: dict = {}
    for row in rows:
        strata.setdefault(row[key], []).append(row)
    columns = [strata[k] for k in sorted(strata)]
    return [col[i] for i in range(max(map(len, columns), default=0)) for col in columns if i < len(col)]


def lm_eval_task_yaml(task: str, jsonl_path: Path, trained_depths: Iterable[int] = ()) -> str:
    """A local lm-eval multiple-choice task reading ``jsonl_path`` (absolute: lm-eval resolves
    ``data_files`` against the working directory, not the YAML's folder, and plain ``lm_eval`` must
    work from anywhere). A copied or moved corpus folder still reads its own items through this
    stack: ``tools/eval_loops.py`` reads the file of that name beside the YAML and says so
    (``eval/harness.py`` ``located_spec``). ``trained_depths`` go into the task's metadata, where the
    loop sweep reads which depths the training documents covered."""
    depths = list(trained_depths)
    return (
        "# data_files: absolute, for lm_eval run from anywhere; tools/eval_loops.py reads the file of that\n"
        "# name beside this YAML when the folder was copied or moved (and says so)\n"
        f"task: {TASK_NAMES[task]}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {json.dumps(str(jsonl_path.resolve()))}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        # Column names, not templates: lm-eval reads a feature of that name directly.
        "doc_to_text: query\n"
        "doc_to_choice: choices\n"
        "doc_to_target: gold\n"
        "metric_list:\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1.0\n"
        + (f"  trained_depths: {json.dumps(depths)}\n" if depths else "")
    )


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def generate_corpus(output_dir: str | Path, spec: CorpusSpec = CorpusSpec()) -> dict:
    """Write ``train.jsonl``, ``valid.jsonl``, ``eval/<task>.jsonl``, ``eval/<task>.yaml`` and
    ``manifest.json`` under ``output_dir``; returns the manifest.

    Train/valid lines are ``{"text", "source", "depth"}`` (source prose, one of the reasoning
    generators, or facts; depth 0 for prose and facts). Eval lines are lm-eval multiple-choice docs
    ``{"query", "choices", "gold", "task"}`` plus ``depth`` (reasoning) or ``attribute`` and
    ``person`` (facts; with ``knowledge_eval="template"`` also ``template`` and ``exposures``); the
    YAMLs define tasks ``looplm_<task>_local`` for each reasoning generator and ``looplm_facts_local``
    (load with ``lm_eval --include_path <output_dir>/eval``).

    Held out by construction: no reasoning eval context occurs in train or valid; the facts
    of the knowledge items are stated only in train (valid has its own people), and, with
    ``knowledge_eval="heldout"`` (default), their questions occur nowhere in train. With
    ``knowledge_eval="trained"`` the items are the questions train answers (stored facts); with
    ``"template"`` each is the paraphrase of its fact that train never states (closed-book recall).
    """
    spec.validate()
    out = Path(output_dir)
    (out / "eval").mkdir(parents=True, exist_ok=True)
    n_qa = int(spec.knowledge_people * spec.knowledge_qa_fraction)
    tasks = spec.reasoning_tasks
    train_total = (spec.prose_docs + len(tasks) * spec.reasoning_docs_per_task
                   + spec.knowledge_people * spec.knowledge_mentions + n_qa * spec.knowledge_qa_mentions
                   + spec.control_docs)
    # Validation keeps the train mix (prose, per-task and biography shares of valid_docs);
    # its biographies are of other people, so no fact of the knowledge items is in it.
    share = spec.valid_docs / max(1, train_total)
    n_reason = round(share * spec.reasoning_docs_per_task)
    valid_people = round(share * spec.knowledge_people) if spec.knowledge_mentions else 0
    n_valid_bios = valid_people * spec.knowledge_mentions
    people = make_people(random.Random(f"{spec.seed}-people"), spec.knowledge_people + valid_people)
    train_people, valid_people_list = people[:spec.knowledge_people], people[spec.knowledge_people:]
    qa_people, heldout_people = train_people[:n_qa], train_people[n_qa:]

    held_out = None
    if spec.knowledge_eval == "template":  # one paraphrase per fact never used in that person's biographies
        rng = random.Random(f"{spec.seed}-templates")
        held_out = {p.name: p.draw_held_out(rng) for p in train_people}
    # the held-out contexts of the trained depths, drawn first, written into neither train nor valid
    held = {task: held_out_items(task, spec) for task in tasks}
    exclude = frozenset(item.context for by_depth in held.values() for items in by_depth.values() for item in items)
    # the in-context control's people: names outside the knowledge population, split into training and eval names
    pool = sorted(set(all_names()) - {p.name for p in people})
    random.Random(f"{spec.seed}-control-names").shuffle(pool)
    control_train_names, control_eval_names = pool[:len(pool) // 2], pool[len(pool) // 2:]
    n_valid_control = round(share * spec.control_docs)
    contexts: set[str] = set()
    train = _documents(random.Random(f"{spec.seed}-train"), spec, spec.prose_docs,
                       spec.reasoning_docs_per_task, train_people, spec.knowledge_mentions,
                       qa_people, contexts, held_out, exclude,
                       (spec.control_docs, control_train_names, f"{spec.seed}-control-train"))
    # the rest of valid_docs is prose; none when train has no prose (it would be out of distribution)
    n_valid_prose = (max(0, spec.valid_docs - len(tasks) * n_reason - n_valid_bios - n_valid_control)
                     if spec.prose_docs else 0)
    valid = _documents(random.Random(f"{spec.seed}-valid"), spec, n_valid_prose, n_reason,
                       valid_people_list, spec.knowledge_mentions, [], contexts, None, exclude,
                       (n_valid_control, control_train_names, f"{spec.seed}-control-valid"))
    _write_jsonl(out / "train.jsonl", train)
    _write_jsonl(out / "valid.jsonl", valid)

    eval_rows = {task: _interleave([dict(item.eval_doc(), **({"seen": seen} if task in FINITE_TASKS else {}),
                                         **({"split": _split(item.depth, seen, spec)} if held[task] else {}))
                                    for item, seen in _eval_items(task, spec, contexts, held[task])])
                 for task in tasks}
    if spec.control_items:
        crng = random.Random(f"{spec.seed}-eval-{CONTROL_TASK}")
        eval_rows[CONTROL_TASK] = _interleave([open_book_doc(random_person(crng, control_eval_names), crng)
                                               for _ in range(spec.control_items)], key="attribute")
    rng = random.Random(f"{spec.seed}-eval-{KNOWLEDGE_TASK}")
    if held_out is not None:
        docs = [d for p in train_people for d in p.template_docs(rng, held_out[p.name], spec.knowledge_mentions)]
    else:
        asked = qa_people if spec.knowledge_eval == "trained" else heldout_people
        docs = [d for p in asked for d in p.eval_docs(rng)]
    eval_rows[KNOWLEDGE_TASK] = _interleave(docs, key="attribute")
    eval_counts = {}
    for task, rows in eval_rows.items():
        path = out / "eval" / f"{task}.jsonl"
        _write_jsonl(path, rows)
        # the reasoning tasks' training documents cover depths 1..train_max_depth; facts have no depth
        depths = range(1, spec.train_max_depth + 1) if task in tasks else ()
        yaml = lm_eval_task_yaml(task, path, trained_depths=depths)
        write_atomic(out / "eval" / f"{task}.yaml", yaml)
        eval_counts[TASK_NAMES[task]] = len(rows)
    manifest = {
        "seed": spec.seed, "spec": spec.__dict__, "train_documents": len(train),
        "valid_documents": len(valid), "eval_items": eval_counts,
        "knowledge": {"people": len(train_people), "qa_people": len(qa_people),
                      "heldout_people": len(heldout_people), "valid_people": len(valid_people_list)},
        "eval_include_path": str((out / "eval").resolve()),
        "licence": "generated from templates in megatron_loop/data/corpus.py; Apache-2.0",
    }
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return manifest
