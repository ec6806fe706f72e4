"""Templates of the generated corpus: prose, and the reasoning generators with a depth knob.

The paper measures reasoning on ProofWriter, CLUTRR and BBH ``tracking_shuffled_objects``
(App. C.3, Table 5), the tasks whose difficulty is set by an explicit compositional parameter;
each generator here mirrors one with a ``depth`` (chain length, proof depth, number of swaps),
plus chained arithmetic. :mod:`megatron_loop.data.corpus` assembles the corpus from them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

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
POINTER_TASK = "pointer"                        # in-context pointer chasing (piloted for finding1_paired)
COMPOSE_TASK = "compose"                        # composition of digit permutations (finding1_paired)
REASONING_TASKS = (*TASKS, ARITH_TASK, POINTER_TASK, COMPOSE_TASK)  # every generator (CorpusSpec.reasoning_tasks)
# Tasks whose short contexts are few enough for training to contain them all (compose: 10 x 3^h
# at depth h): their items are distinct contexts, in the train / valid documents or not, each
# marked ``seen``.
FINITE_TASKS = (COMPOSE_TASK,)
KNOWLEDGE_TASK = "facts"                        # recall of the population's facts (see Person)
CONTROL_TASK = "openbook"                       # the facts' in-context control (corpus_knowledge.open_book)
TASK_NAMES = {task: f"looplm_{task}_local" for task in (*REASONING_TASKS, KNOWLEDGE_TASK, CONTROL_TASK)}
KNOWLEDGE_EVAL = ("heldout", "trained", "template")  # what the knowledge items ask (CorpusSpec.knowledge_eval)


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
    # What follows the context in the query (``{question}`` is filled in); the answer comes after it.
    ask: str = "\nQuestion: {question}\nAnswer:"

    @property
    def query(self) -> str:
        return self.context + self.ask.format(question=self.question)

    def training_text(self, follow_ups: int = 0) -> str:
        """Pretraining document: the query followed by the answer, as lm-eval scores it, then
        the first ``follow_ups`` further questions with their answers."""
        text = f"{self.query} {self.choices[self.gold]}"
        return text + "".join(f"\nQuestion: {q}\nAnswer: {a}" for q, a in self.follow_ups[:follow_ups])

    def eval_doc(self) -> dict:
        """lm-eval multiple-choice document (``doc_to_text``/``choice``/``target`` fields)."""
        return {"query": self.query, "choices": list(self.choices), "gold": self.gold,
                "depth": self.depth, "task": self.task}


def shuffled_choices(rng: random.Random, correct: str, distractors: list[str]) -> tuple[tuple[str, ...], int]:
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
    choices, gold = shuffled_choices(rng, correct, distractors)
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


# Variables of the pointer-chasing task: single lowercase letters, without a and i (English words)
# and l and o (read as 1 and 0). Every variable is written after a space (" k"), one token form.
POINTER_VARIABLES = tuple("bcdefghjkmnpqrstuvwxyz")
POINTER_CHAINS = 3  # the asked chain and two distractor chains of the same length


def make_pointer(rng: random.Random, depth: int, chains: int = POINTER_CHAINS) -> ReasoningItem:
    """In-context pointer chasing: ``chains`` disjoint chains of ``depth`` assignments each,
    ``k = m. m = q. q = 7.``, all statements shuffled together; the question asks the value of
    the head of one chain (``What is k?`` -> ``7``), so the answer takes ``depth`` look-ups.

    No lexical shortcut: the answer is a digit chosen among all ten (plain accuracy, chance 10 %),
    every chain ends in a different digit and has the same length, so neither the digits present,
    the statement order (shuffled) nor any chain's length points to the answer; a model that only
    copies a digit from the context scores 1 / ``chains``. Variables are letters and values digits,
    every one of them in training at every depth; a depth beyond training needs more look-ups of
    the same kind, not a new word (contrast the CLUTRR-style kinship words). Follow-ups (training
    documents only): the other chains' heads, then the intermediate variables (shorter chains).
    """
    if depth * chains > len(POINTER_VARIABLES):
        raise ValueError(f"pointer depth {depth} x {chains} chains needs more than the "
                         f"{len(POINTER_VARIABLES)} variables")
    names = rng.sample(POINTER_VARIABLES, depth * chains)
    values = rng.sample(DIGITS, chains)
    statements, answers = [], {}
    for c in range(chains):
        chain = names[c * depth:(c + 1) * depth]
        for i, var in enumerate(chain):
            statements.append(f"{var} = {chain[i + 1] if i + 1 < depth else values[c]}.")
            answers[var] = (values[c], depth - i)  # value, look-ups from this variable
    rng.shuffle(statements)
    head = names[0]
    heads = [names[c * depth] for c in range(1, chains)]
    inner = [v for v in names if v not in heads and v != head]
    rng.shuffle(heads)
    rng.shuffle(inner)
    follow = tuple((_pointer_question(v), answers[v][0]) for v in heads + inner)
    return ReasoningItem(POINTER_TASK, depth, "Given: " + " ".join(statements), _pointer_question(head), DIGITS,
                         DIGITS.index(answers[head][0]), follow)


def _pointer_question(var: str) -> str:
    return f"What is {var}?"


# The moves of the compose task: fixed permutations of the ten digits, part of the task (the same in
# every corpus), stored only in the weights of a model that learns them.
# The first three are finding1_paired's; a corpus with ``compose_moves`` = n uses the first n (more moves,
# more contexts per depth: 10 x n^h, so that contexts of the trained depths can be held out of training).
COMPOSE_MOVE_NAMES = ("f", "g", "h", "k", "m", "p")
COMPOSE_MOVES: dict[str, tuple[int, ...]] = {
    move: tuple(random.Random(f"compose-move-{move}").sample(range(10), 10)) for move in COMPOSE_MOVE_NAMES}


def make_compose(rng: random.Random, depth: int, moves: int = 3) -> ReasoningItem:
    """Composition of digit permutations, ``7 f g g =`` -> the digit reached from 7 by the moves f,
    then g, then g: ``depth`` moves drawn from ``moves`` fixed permutations of the digits
    (:data:`COMPOSE_MOVES`; three unless the corpus sets ``compose_moves``), so the answer composes ``depth`` steps (the state tracking of BBH's
    ``tracking_shuffled_objects`` with the shuffles learned rather than stated).

    No lexical shortcut: the answer is a digit among all ten (plain accuracy, chance 10 %); every
    move is a bijection, so every answer is equally likely at every depth and no move, count or start
    alone determines it; a depth beyond training is a longer string of the same tokens. What a model
    needs besides the composition is the 10-entry tables, which every training document uses.
    Depth h has 10 x moves^h contexts: with three moves a corpus of tens of thousands of items contains
    every one of depths 1-4 (the eval items there are distinct contexts marked ``seen``), none of
    depths 5-6; a corpus with ``held_out_contexts`` (data/corpus.py) keeps some contexts of every
    trained depth from 2 on out of training, so that the items of the trained depths are compositions
    the model has never seen answered.
    Compact on purpose (one short line per item): at toy scale the answers must be a large share of
    the tokens for the composition to be learned in minutes (docs/REPRODUCE.md, the pilots).
    """
    if not 1 <= moves <= len(COMPOSE_MOVE_NAMES):
        raise ValueError(f"compose moves={moves}: expected 1..{len(COMPOSE_MOVE_NAMES)}")
    start = rng.randrange(10)
    drawn = [rng.choice(COMPOSE_MOVE_NAMES[:moves]) for _ in range(depth)]
    return ReasoningItem(COMPOSE_TASK, depth, f"{start} {' '.join(drawn)}", "", DIGITS, compose(start, drawn),
                         ask=" =")


def compose(start: int, moves: list[str] | tuple[str, ...]) -> int:
    """The digit reached from ``start`` by applying ``moves`` in order (the compose task's answer)."""
    value = start
    for move in moves:
        value = COMPOSE_MOVES[move][value]
    return value


GENERATORS: dict[str, Callable[[random.Random, int], ReasoningItem]] = {
    "clutrr": make_clutrr, "proofwriter": make_proofwriter, "tracking": make_tracking, ARITH_TASK: make_arith,
    POINTER_TASK: make_pointer, COMPOSE_TASK: make_compose,
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
