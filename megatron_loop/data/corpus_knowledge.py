"""Knowledge items of the generated corpus: facts stored in the weights (App. C.3, Knowledge group)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from megatron_loop.data.corpus_templates import FEMALE_NAMES, MALE_NAMES, shuffled_choices
from megatron_loop.errors import LoopConfigError

# A fictional population; each person's birth year, home town and employer are stated only in
# training biographies (several paraphrases per person, in random order), so recalling them
# from a question needs the facts memorised during training, not reasoning over the prompt.
# As in mixed biography + QA pretraining, the questions about part of the population are
# training documents too (they teach the question form); the questions about the others are
# the held-out evaluation items. In the held-out-template reading (``knowledge_eval="template"``)
# there are no questions at all: each fact is asked in the one statement paraphrase that this
# person's biographies never use for it (the other people's biographies do), so the item is
# recall of a stored fact through a form never seen with it, not completion of a seen string.
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

    def biography(self, rng: random.Random, held_out: dict[str, int] | None = None) -> str:
        """One training mention: every fact in a randomly chosen paraphrase, in random order;
        ``held_out`` (attribute -> paraphrase index) excludes that paraphrase of that fact."""
        sentences = []
        for a, v in self.facts:
            allowed = [t for i, t in enumerate(_STATEMENTS[a]) if held_out is None or i != held_out[a]]
            sentences.append(rng.choice(allowed).format(name=self.name, value=v))
        rng.shuffle(sentences)
        return " ".join(sentences)

    def draw_held_out(self, rng: random.Random) -> dict[str, int]:
        """One paraphrase per attribute kept out of this person's biographies (the eval template)."""
        return {a: rng.randrange(len(_STATEMENTS[a])) for a, _ in self.facts}

    def template_docs(self, rng: random.Random, held_out: dict[str, int], exposures: int) -> list[dict]:
        """lm-eval multiple-choice documents asking each fact in its held-out paraphrase: the statement
        up to the value (``Nora Abbott grew up in`` -> `` Lisbon``), gold + 3 other values of the attribute."""
        docs = []
        for attribute, value in self.facts:
            template = _STATEMENTS[attribute][held_out[attribute]]
            query = template.split("{value}")[0].rstrip().format(name=self.name)
            distractors = rng.sample([x for x in KNOWLEDGE_ATTRIBUTES[attribute] if x != value],
                                     KNOWLEDGE_CHOICES - 1)
            choices, gold = shuffled_choices(rng, value, distractors)
            docs.append({"query": query, "choices": list(choices), "gold": gold, "attribute": attribute,
                         "person": self.name, "template": held_out[attribute], "exposures": exposures,
                         "task": "facts"})
        return docs

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
            choices, gold = shuffled_choices(rng, value, distractors)
            docs.append({"query": self.question(attribute), "choices": list(choices), "gold": gold,
                         "attribute": attribute, "person": self.name, "task": "facts"})
        return docs


def open_book(person: Person, rng: random.Random) -> tuple[str, str, str]:
    """The in-context control of the knowledge items (``openbook``): ``(query, value, attribute)`` where
    the query is a short biography of ``person`` (each fact once, in a random paraphrase, in random order)
    followed by one of the facts restarted in another paraphrase, up to its value (``Nora Abbott grew up
    in Lisbon. ... Nora Abbott's home town is`` -> `` Lisbon``). The person is fresh (random values, a name
    outside the knowledge population), so the answer is read from the context, never recalled from the
    weights: the same surface form as a ``facts`` item without the stored fact."""
    used = {a: rng.randrange(len(_STATEMENTS[a])) for a, _ in person.facts}
    sentences = [_STATEMENTS[a][used[a]].format(name=person.name, value=v) for a, v in person.facts]
    rng.shuffle(sentences)
    attribute, value = rng.choice(person.facts)
    other = rng.choice([i for i in range(len(_STATEMENTS[attribute])) if i != used[attribute]])
    ask = _STATEMENTS[attribute][other].split("{value}")[0].rstrip().format(name=person.name)
    return " ".join(sentences) + " " + ask, value, attribute


def open_book_doc(person: Person, rng: random.Random) -> dict:
    """An lm-eval multiple-choice document of the ``openbook`` control: gold + 3 other values."""
    query, value, attribute = open_book(person, rng)
    distractors = rng.sample([x for x in KNOWLEDGE_ATTRIBUTES[attribute] if x != value], KNOWLEDGE_CHOICES - 1)
    choices, gold = shuffled_choices(rng, value, distractors)
    return {"query": query, "choices": list(choices), "gold": gold, "attribute": attribute, "person": person.name,
            "task": "openbook"}


def random_person(rng: random.Random, names: list[str]) -> Person:
    """A person named from ``names`` (repeats allowed) with fresh random facts: an ``openbook`` context."""
    return Person(rng.choice(names), tuple((a, rng.choice(values)) for a, values in KNOWLEDGE_ATTRIBUTES.items()))


def all_names() -> list[str]:
    return [f"{first} {last}" for first in FEMALE_NAMES + MALE_NAMES for last in SURNAMES]


def make_people(rng: random.Random, count: int, names: list[str] | None = None) -> list[Person]:
    """``count`` people with distinct full names (first name x surname, or from ``names``) and random facts."""
    names = all_names() if names is None else names
    if count > len(names):
        raise LoopConfigError(f"knowledge_people={count}: at most {len(names)} distinct names")
    return [Person(name, tuple((a, rng.choice(values)) for a, values in KNOWLEDGE_ATTRIBUTES.items()))
            for name in rng.sample(names, count)]
