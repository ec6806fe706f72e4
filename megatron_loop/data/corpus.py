"""A small, licence-clean corpus generated from templates, with depth-controlled reasoning.

The paper pretrains on FineWeb-Edu (App. C.1) and measures reasoning on ProofWriter, CLUTRR
and BBH ``tracking_shuffled_objects`` (App. C.3, Table 5), the three tasks whose
difficulty is set by an explicit compositional parameter. Nothing here is downloaded: prose is
built from word lists in this file, and the three reasoning generators mirror those tasks
with a ``depth`` knob (chain length, proof depth, number of swaps), so a tiny model trained
on CPU can show accuracy by depth and loop count. Everything is deterministic given a seed
(``random.Random`` seeded with a string uses SHA-512, not Python's salted ``hash``).

Generated text is original and released with the repository (Apache-2.0).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from megatron_loop.atomic import write_atomic
from megatron_loop.errors import LoopConfigError

FEMALE_NAMES = (
    "Alice", "Beth", "Clara", "Diana", "Emma", "Fiona", "Grace", "Hannah", "Irene", "Julia",
    "Karen", "Laura", "Maria", "Nora", "Olivia", "Paula", "Quinn", "Rosa", "Sara", "Tina",
)
MALE_NAMES = (
    "Adam", "Brian", "Carl", "David", "Eric", "Frank", "George", "Henry", "Ivan", "James",
    "Kevin", "Louis", "Mark", "Nathan", "Oscar", "Peter", "Ralph", "Steve", "Tom", "Victor",
)
ATTRIBUTES = (
    "red", "big", "kind", "green", "round", "quiet", "young", "rough", "cold", "nice",
    "blue", "smart", "furry", "white", "tall", "happy", "calm", "loud", "soft", "brave",
    "heavy", "shy", "fast", "sweet", "wise", "bright", "dark", "small", "warm", "strong",
)
COLORS = ("red", "blue", "green", "yellow", "purple", "orange", "white", "black", "pink")
OBJECT_NOUNS = ("ball", "present", "hat", "book", "kite")

# Prose word lists: enough variety for a BPE tokenizer and a language-model warm-up.
_ADJ = ("small", "old", "quiet", "bright", "busy", "green", "cold", "warm", "tall", "gentle",
        "careful", "curious", "heavy", "narrow", "wide", "early", "late", "simple", "strange")
_NOUN = ("river", "garden", "teacher", "farmer", "village", "window", "bridge", "forest",
         "student", "library", "market", "mountain", "kitchen", "road", "school", "boat",
         "letter", "lamp", "field", "storm", "clock", "painter", "doctor", "bird")
_PLACE = ("the park", "the station", "the old mill", "the harbour", "the valley",
          "the town square", "the museum", "the orchard", "the hill", "the beach")
_VERB = ("watched", "painted", "carried", "found", "opened", "visited", "repaired", "cleaned",
         "followed", "counted", "measured", "described", "remembered", "built", "planted")
_ADVERB = ("slowly", "quickly", "carefully", "happily", "quietly", "again", "together", "early")
_TIME = ("In the morning", "At noon", "Later that day", "In the evening", "Before dawn",
         "After the rain", "During the winter", "Every spring", "On Sunday", "Last year")
_FACT = (
    "Water boils when it is heated for a long time.",
    "Plants need light and water to grow.",
    "A week has seven days.",
    "The sun rises in the east and sets in the west.",
    "Ice melts when it becomes warm.",
    "Birds build nests in the spring.",
    "A triangle has three sides.",
    "Bees carry pollen from one flower to another.",
    "Sound travels more slowly than light.",
    "Rivers flow from the hills down to the sea.",
)

TASKS = ("clutrr", "proofwriter", "tracking")  # the reasoning generators of the default corpus
ARITH_TASK = "arith"                            # chained arithmetic (the knowledge/reasoning study)
REASONING_TASKS = (*TASKS, ARITH_TASK)          # every reasoning generator (CorpusSpec.reasoning_tasks)
KNOWLEDGE_TASK = "facts"                        # recall of the population's facts (see Person)
TASK_NAMES = {task: f"looplm_{task}_local" for task in (*REASONING_TASKS, KNOWLEDGE_TASK)}
KNOWLEDGE_EVAL = ("heldout", "trained")         # which people the knowledge items ask about (CorpusSpec)


@dataclass(frozen=True)
class ReasoningItem:
    """One multiple-choice reasoning problem; ``depth`` is its compositional parameter."""

    task: str
    depth: int
    context: str
    question: str
    choices: tuple[str, ...]
    gold: int
    # Further (question, answer) pairs about the same context, asked after the main one in
    # training documents only: more supervised answers per context token (held-out items
    # are scored on the main question alone).
    follow_ups: tuple[tuple[str, str], ...] = ()

    @property
    def query(self) -> str:
        return f"{self.context}\nQuestion: {self.question}\nAnswer:"

    def training_text(self, follow_ups: int = 0) -> str:
        """Pretraining document: the query followed by the answer, as lm-eval scores it, then
        the first ``follow_ups`` further questions with their answers."""
        text = f"{self.query} {self.choices[self.gold]}"
        return text + "".join(f"\nQuestion: {q}\nAnswer: {a}" for q, a in self.follow_ups[:follow_ups])

    def eval_doc(self) -> dict:
        """lm-eval multiple-choice document (``doc_to_text``/``choice``/``target`` fields)."""
        return {"query": self.query, "choices": list(self.choices), "gold": self.gold,
                "depth": self.depth, "task": self.task}


def _shuffled_choices(rng: random.Random, correct: str, distractors: list[str]) -> tuple[tuple[str, ...], int]:
    choices = [correct] + [d for d in dict.fromkeys(distractors) if d != correct]
    rng.shuffle(choices)
    return tuple(choices), choices.index(correct)


def _kin_word(direction: str, generations: int, female: bool) -> str:
    """Kinship noun for a lineal relative ``generations`` steps up ("up") or down ("down")."""
    base = {("up", True): "mother", ("up", False): "father",
            ("down", True): "daughter", ("down", False): "son"}[(direction, female)]
    if generations == 1:
        return base
    return "great-" * (generations - 2) + "grand" + base


def make_clutrr(rng: random.Random, depth: int) -> ReasoningItem:
    """CLUTRR-style kinship chain: ``depth`` stated parent/child hops, facts shuffled.

    The answer (e.g. "great-grandmother") composes all hops, so the chain length is the
    number of relation compositions needed, as in CLUTRR's k-hop stories.
    """
    direction = rng.choice(("up", "down"))
    genders = [rng.random() < 0.5 for _ in range(depth + 1)]
    pools = {True: list(FEMALE_NAMES), False: list(MALE_NAMES)}
    for pool in pools.values():
        rng.shuffle(pool)
    people = [pools[female].pop() for female in genders]
    facts = []
    for i in range(depth):
        rel = _kin_word(direction, 1, genders[i + 1])
        if rng.random() < 0.5:
            facts.append(f"{people[i + 1]} is the {rel} of {people[i]}.")
        else:
            facts.append(f"{people[i]}'s {rel} is {people[i + 1]}.")
    rng.shuffle(facts)
    female = genders[-1]
    correct = _kin_word(direction, depth, female)
    near = depth + 2 if depth == 1 else depth - 1
    distractors = [_kin_word(direction, near, female), _kin_word(direction, depth + 1, female),
                   _kin_word(direction, depth, not female)]
    choices, gold = _shuffled_choices(rng, correct, distractors)
    question = _clutrr_question(people[-1], people[0])
    # Follow-ups: the relation of every intermediate person to the first (shorter chains).
    follow = [(_clutrr_question(people[i], people[0]), _kin_word(direction, i, genders[i]))
              for i in range(1, depth)]
    rng.shuffle(follow)
    return ReasoningItem("clutrr", depth, " ".join(facts), question, choices, gold, tuple(follow))


def _clutrr_question(person: str, anchor: str) -> str:
    return f"How is {person} related to {anchor}? {person} is {anchor}'s"


def make_proofwriter(rng: random.Random, depth: int) -> ReasoningItem:
    """ProofWriter-style rule chaining under the closed-world assumption.

    Two entities each have one fact and a ``depth``-long chain of rules starting from it;
    the question asks whether one entity has the last attribute of one of the chains. The
    answer is True (proof of depth ``depth``) or False (the chain starts from the other
    entity's fact), so both answers need the whole chain to be followed.
    """
    attrs = rng.sample(ATTRIBUTES, 2 * (depth + 1))
    chain_a, chain_b = attrs[: depth + 1], attrs[depth + 1:]
    ent_a, ent_b = rng.sample(FEMALE_NAMES + MALE_NAMES, 2)
    facts = [f"{ent_a} is {chain_a[0]}.", f"{ent_b} is {chain_b[0]}."]
    rules = [f"If someone is {c[i]} then they are {c[i + 1]}."
             for c in (chain_a, chain_b) for i in range(depth)]
    rng.shuffle(facts)
    rng.shuffle(rules)
    entity, owner_chain, other_chain = rng.choice(((ent_a, chain_a, chain_b), (ent_b, chain_b, chain_a)))
    truth = rng.random() < 0.5
    queried = (owner_chain if truth else other_chain)[-1]
    # Follow-ups: the other entity/conclusion pairs (proofs of the same depth).
    follow = [(_proofwriter_question(e, c[-1]), "True" if c is own else "False")
              for e, own in ((ent_a, chain_a), (ent_b, chain_b)) for c in (chain_a, chain_b)
              if (e, c[-1]) != (entity, queried)]
    rng.shuffle(follow)
    return ReasoningItem("proofwriter", depth, " ".join(facts + rules), _proofwriter_question(entity, queried),
                         ("True", "False"), 0 if truth else 1, tuple(follow))


def _proofwriter_question(entity: str, attribute: str) -> str:
    return f"Is the statement \"{entity} is {attribute}\" True or False?"


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def make_tracking(rng: random.Random, depth: int, num_objects: int = 3) -> ReasoningItem:
    """BBH ``tracking_shuffled_objects``-style: ``depth`` pairwise swaps among ``num_objects``."""
    noun = rng.choice(OBJECT_NOUNS)
    people = rng.sample(FEMALE_NAMES + MALE_NAMES, num_objects)
    objects = [f"{c} {noun}" for c in rng.sample(COLORS, num_objects)]
    holding = dict(zip(people, objects))
    start = ", ".join(f"{p} has {_article(o)} {o}" for p, o in holding.items())
    swaps = []
    for _ in range(depth):
        a, b = rng.sample(people, 2)
        holding[a], holding[b] = holding[b], holding[a]
        swaps.append(f"Then {a} and {b} swap their {noun}s.")
    target = rng.choice(people)
    context = (f"{', '.join(people[:-1])} and {people[-1]} are playing a game. At the start, "
               f"{start}. " + " ".join(swaps))
    choices = tuple(objects)
    # Follow-ups: what each other player ends with.
    follow = [(_tracking_question(p), holding[p]) for p in people if p != target]
    rng.shuffle(follow)
    return ReasoningItem("tracking", depth, context, _tracking_question(target), choices,
                         choices.index(holding[target]), tuple(follow))


def _tracking_question(person: str) -> str:
    return f"At the end of the game, what does {person} have? {person} has the"


ARITH_OPS = (("plus", tuple(range(1, 10))), ("times", (3, 7, 9)))  # x + n, x * n mod 10 (both bijective)
DIGITS = tuple(str(d) for d in range(10))


def make_arith(rng: random.Random, depth: int) -> ReasoningItem:
    """Chained arithmetic mod 10: a start digit and ``depth`` operations ``plus n`` / ``times n``
    applied in order; the answer is the last digit of the result, chosen among all ten digits.

    The operations do not commute, and each is a bijection of the digits (n invertible mod 10
    for ``times``), so every step changes the answer and every answer is equally likely: the
    answer composes all ``depth`` steps, a serial computation whose length is set by ``depth``
    and which uses the prompt alone (no fact to recall). Each single step is a 10 x 12 table,
    small enough for any of the study's models to hold; what a deeper computation needs is depth.
    Follow-ups (training documents only) ask for the digit after each earlier step.
    """
    start = rng.randrange(10)
    value, steps, states = start, [], []
    for _ in range(depth):
        op, operands = rng.choice(ARITH_OPS)
        n = rng.choice(operands)
        value = (value + n) % 10 if op == "plus" else (value * n) % 10
        steps.append(f"{op} {n}")
        states.append(value)
    context = f"Start with {start}, then " + ", then ".join(steps) + "."
    follow = [(_arith_question(i), str(states[i - 1])) for i in range(1, depth)]
    rng.shuffle(follow)
    return ReasoningItem(ARITH_TASK, depth, context, _arith_question(depth), DIGITS, states[-1], tuple(follow))


def _arith_question(step: int) -> str:
    return f"What is the last digit after step {step}?"


GENERATORS: dict[str, Callable[[random.Random, int], ReasoningItem]] = {
    "clutrr": make_clutrr, "proofwriter": make_proofwriter, "tracking": make_tracking, ARITH_TASK: make_arith,
}


def make_prose(rng: random.Random) -> str:
    """A paragraph of simple English-like prose from templates."""
    sentences = []
    for _ in range(rng.randint(3, 8)):
        kind = rng.randrange(4)
        if kind == 0:
            sentences.append(f"The {rng.choice(_ADJ)} {rng.choice(_NOUN)} {rng.choice(_VERB)} "
                             f"the {rng.choice(_NOUN)} near {rng.choice(_PLACE)}.")
        elif kind == 1:
            name = rng.choice(FEMALE_NAMES + MALE_NAMES)
            sentences.append(f"{rng.choice(_TIME)}, {name} {rng.choice(_VERB)} a "
                             f"{rng.choice(_ADJ)} {rng.choice(_NOUN)} {rng.choice(_ADVERB)}.")
        elif kind == 2:
            sentences.append(rng.choice(_FACT))
        else:
            sentences.append(f"Nobody at {rng.choice(_PLACE)} {rng.choice(_VERB)} the "
                             f"{rng.choice(_NOUN)}, so the {rng.choice(_NOUN)} stayed "
                             f"{rng.choice(_ADJ)}.")
    return " ".join(sentences)


# --- Knowledge: facts stored in the weights (paper App. C.3, Knowledge group) ---------------
# A fictional population; each person's birth year, home town and employer are stated only in
# training biographies (several paraphrases per person, in random order), so recalling them
# from a question needs the facts memorised during training, not reasoning over the prompt.
# As in mixed biography + QA pretraining, the questions about part of the population are
# training documents too (they teach the question form); the questions about the others are
# the held-out evaluation items.
SURNAMES = (
    "Abbott", "Barlow", "Carver", "Dalton", "Ellison", "Fairley", "Garner", "Hadley", "Ingram",
    "Jarvis", "Keller", "Lowell", "Mercer", "Norris", "Osborne", "Prescott", "Quimby", "Radley",
    "Sutton", "Thorne", "Upton", "Vance", "Walsh", "Yates",
)
CITIES = ("Lisbon", "Oslo", "Dublin", "Vienna", "Prague", "Madrid", "Athens", "Berlin",
          "Warsaw", "Geneva", "Milan", "Porto", "Bergen", "Lyon", "Krakow", "Seville")
EMPLOYERS = ("Alder Foods", "Brightwater Bank", "Cobalt Motors", "Driftwood Press",
             "Evergreen Energy", "Falcon Airlines", "Granite Insurance", "Harbor Shipping",
             "Ironwood Tools", "Juniper Software", "Kestrel Mining", "Lakeside Hotels")
BIRTH_YEARS = tuple(str(year) for year in range(1950, 2000))
KNOWLEDGE_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "birth_year": BIRTH_YEARS, "city": CITIES, "employer": EMPLOYERS,
}
_STATEMENTS = {  # biography paraphrases, one drawn per mention
    "birth_year": ("{name} was born in {value}.", "{name}'s year of birth is {value}.",
                   "The birth year of {name} is {value}."),
    "city": ("{name} grew up in {value}.", "{name}'s home town is {value}.",
             "{name} spent a childhood in {value}."),
    "employer": ("{name} works for {value}.", "{name} is employed by {value}.",
                 "{name} has a job at {value}."),
}
_QUESTIONS = {
    "birth_year": "In which year was {name} born?",
    "city": "In which city did {name} grow up?",
    "employer": "Which company does {name} work for?",
}
KNOWLEDGE_CHOICES = 4  # gold + 3 distractors of the same attribute: chance 25 %


@dataclass(frozen=True)
class Person:
    """One member of the fictional population: a unique full name and one value per attribute."""

    name: str
    facts: tuple[tuple[str, str], ...]  # (attribute, value) in KNOWLEDGE_ATTRIBUTES order

    def biography(self, rng: random.Random) -> str:
        """One training mention: every fact in a randomly chosen paraphrase, in random order."""
        sentences = [rng.choice(_STATEMENTS[a]).format(name=self.name, value=v) for a, v in self.facts]
        rng.shuffle(sentences)
        return " ".join(sentences)

    def question(self, attribute: str) -> str:
        return f"Question: {_QUESTIONS[attribute].format(name=self.name)}\nAnswer:"

    def qa_text(self, rng: random.Random) -> str:
        """Training document for a person of the QA part: each question with its answer."""
        pairs = [f"{self.question(a)} {v}" for a, v in self.facts]
        rng.shuffle(pairs)
        return "\n".join(pairs)

    def eval_docs(self, rng: random.Random) -> list[dict]:
        """lm-eval multiple-choice documents, one per attribute; the prompt names only the person."""
        docs = []
        for attribute, value in self.facts:
            distractors = rng.sample([x for x in KNOWLEDGE_ATTRIBUTES[attribute] if x != value],
                                     KNOWLEDGE_CHOICES - 1)
            choices, gold = _shuffled_choices(rng, value, distractors)
            docs.append({"query": self.question(attribute), "choices": list(choices), "gold": gold,
                         "attribute": attribute, "person": self.name, "task": "facts"})
        return docs


def make_people(rng: random.Random, count: int) -> list[Person]:
    """``count`` people with distinct full names (first name x surname) and random facts."""
    names = [f"{first} {last}" for first in FEMALE_NAMES + MALE_NAMES for last in SURNAMES]
    if count > len(names):
        raise LoopConfigError(f"knowledge_people={count}: at most {len(names)} distinct names")
    return [Person(name, tuple((a, rng.choice(values)) for a, values in KNOWLEDGE_ATTRIBUTES.items()))
            for name in rng.sample(names, count)]


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
    # the quantity that grows with parameters).
    knowledge_eval: str = "heldout"
    knowledge_qa_mentions: int = 1

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
        if self.knowledge_eval not in KNOWLEDGE_EVAL:
            raise LoopConfigError(f"knowledge_eval={self.knowledge_eval!r}: expected one of "
                                  f"{', '.join(KNOWLEDGE_EVAL)}")
        if self.knowledge_eval == "heldout" and not 0.0 <= self.knowledge_qa_fraction < 1.0:
            raise LoopConfigError(f"knowledge_qa_fraction={self.knowledge_qa_fraction}: expected a "
                                  "share in [0, 1) (the rest are the held-out knowledge items)")
        if self.knowledge_eval == "trained" and not 0.0 < self.knowledge_qa_fraction <= 1.0:
            raise LoopConfigError(f"knowledge_qa_fraction={self.knowledge_qa_fraction}: expected a "
                                  "share in (0, 1] with knowledge_eval=trained (the Q&A people are the items)")


def _documents(rng: random.Random, spec: CorpusSpec, n_prose: int, n_reasoning: int,
               bios: list[Person], mentions: int, qa: list[Person],
               contexts: set[str]) -> list[dict]:
    """Mixed prose, reasoning (depths uniform in 1..train_max_depth), ``mentions`` biographies
    of every person in ``bios`` and the Q&A of every person in ``qa``; adds the reasoning
    contexts to ``contexts``. Knowledge documents have source "facts", depth 0."""
    docs = [{"text": make_prose(rng), "source": "prose", "depth": 0} for _ in range(n_prose)]
    for task in spec.reasoning_tasks:
        for _ in range(n_reasoning):
            item = GENERATORS[task](rng, rng.randint(1, spec.train_max_depth))
            contexts.add(item.context)
            docs.append({"text": item.training_text(spec.follow_up_questions), "source": task,
                         "depth": item.depth})
    docs += [{"text": p.biography(rng), "source": "facts", "depth": 0} for p in bios for _ in range(mentions)]
    docs += [{"text": p.qa_text(rng), "source": "facts", "depth": 0}
             for p in qa for _ in range(spec.knowledge_qa_mentions)]
    rng.shuffle(docs)
    return docs


def _eval_items(task: str, spec: CorpusSpec, seen: set[str]) -> Iterator[ReasoningItem]:
    """Held-out items, ``eval_items_per_depth`` per depth; a context seen in training is skipped."""
    rng = random.Random(f"{spec.seed}-eval-{task}")
    for depth in range(spec.eval_min_depth, spec.eval_max_depth + 1):
        made, attempts = 0, 0
        while made < spec.eval_items_per_depth:
            attempts += 1
            if attempts > 100 * max(1, spec.eval_items_per_depth):
                raise LoopConfigError(
                    f"cannot draw {spec.eval_items_per_depth} distinct held-out {task} items at "
                    f"depth {depth}; lower eval_items_per_depth")
            item = GENERATORS[task](rng, depth)
            if item.context in seen:
                continue
            seen.add(item.context)
            made += 1
            yield item


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
    ``data_files`` against the working directory, not the YAML's folder). ``trained_depths`` go into
    the task's metadata, where the loop sweep reads which depths the training documents covered."""
    depths = list(trained_depths)
    return (
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

    Train/valid lines are ``{"text", "source", "depth"}`` (source prose, clutrr, proofwriter,
    tracking or facts; depth 0 for prose and facts). Eval lines are lm-eval multiple-choice docs
    ``{"query", "choices", "gold", "task"}`` plus ``depth`` (reasoning) or ``attribute`` and
    ``person`` (facts); the YAMLs define tasks ``looplm_clutrr_local``,
    ``looplm_proofwriter_local``, ``looplm_tracking_local`` and ``looplm_facts_local`` (load with
    ``lm_eval --include_path <output_dir>/eval``).

    Held out by construction: no reasoning eval context occurs in train or valid; the facts
    of the knowledge items are stated only in train (valid has its own people), and, with
    ``knowledge_eval="heldout"`` (default), their questions occur nowhere in train. With
    ``knowledge_eval="trained"`` the items are the questions train answers (stored facts).
    """
    spec.validate()
    out = Path(output_dir)
    (out / "eval").mkdir(parents=True, exist_ok=True)
    n_qa = int(spec.knowledge_people * spec.knowledge_qa_fraction)
    tasks = spec.reasoning_tasks
    train_total = (spec.prose_docs + len(tasks) * spec.reasoning_docs_per_task
                   + spec.knowledge_people * spec.knowledge_mentions + n_qa * spec.knowledge_qa_mentions)
    # Validation keeps the train mix (prose, per-task and biography shares of valid_docs);
    # its biographies are of other people, so no fact of the knowledge items is in it.
    share = spec.valid_docs / max(1, train_total)
    n_reason = round(share * spec.reasoning_docs_per_task)
    valid_people = round(share * spec.knowledge_people) if spec.knowledge_mentions else 0
    n_valid_bios = valid_people * spec.knowledge_mentions
    people = make_people(random.Random(f"{spec.seed}-people"), spec.knowledge_people + valid_people)
    train_people, valid_people_list = people[:spec.knowledge_people], people[spec.knowledge_people:]
    qa_people, heldout_people = train_people[:n_qa], train_people[n_qa:]

    contexts: set[str] = set()
    train = _documents(random.Random(f"{spec.seed}-train"), spec, spec.prose_docs,
                       spec.reasoning_docs_per_task, train_people, spec.knowledge_mentions,
                       qa_people, contexts)
    # the rest of valid_docs is prose; none when train has no prose (it would be out of distribution)
    n_valid_prose = max(0, spec.valid_docs - len(tasks) * n_reason - n_valid_bios) if spec.prose_docs else 0
    valid = _documents(random.Random(f"{spec.seed}-valid"), spec, n_valid_prose, n_reason,
                       valid_people_list, spec.knowledge_mentions, [], contexts)
    _write_jsonl(out / "train.jsonl", train)
    _write_jsonl(out / "valid.jsonl", valid)

    eval_rows = {task: _interleave([item.eval_doc() for item in _eval_items(task, spec, contexts)])
                 for task in tasks}
    rng = random.Random(f"{spec.seed}-eval-{KNOWLEDGE_TASK}")
    asked = qa_people if spec.knowledge_eval == "trained" else heldout_people
    eval_rows[KNOWLEDGE_TASK] = _interleave([d for p in asked for d in p.eval_docs(rng)], key="attribute")
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
