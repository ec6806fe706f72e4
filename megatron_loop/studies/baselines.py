"""Trivial baselines of the compose items (``data/corpus_templates.make_compose``): what an answer rule that
does not compose every move scores on the same items. A reasoning score is evidence of composition only
above the best of them, which on a finite item set lies above the nominal 10 % chance:

* ``most_common``: always the digit that is most often the answer among these items (an oracle constant:
  chosen on the items it is scored on, so an upper bound for any constant answer);
* ``start_digit``: the answer is the start digit;
* ``last_m_moves``: the start digit moved by the last m moves only (the rest ignored), the best m < h per
  depth (again chosen on the items: an upper bound for every truncation);
* ``first_m_moves``: the start digit moved by the first m moves only, the best m < h.

``best`` is the highest of them per depth. Computed from the items' text and gold alone (no model).
"""

from __future__ import annotations

import re
from collections import Counter

from megatron_loop.data.corpus_templates import compose

RULES = ("most_common", "start_digit", "last_m_moves", "first_m_moves")


def parse(query: str) -> tuple[int, list[str]]:
    """(start digit, moves) of a compose query ``7 f g g =``."""
    match = re.fullmatch(r"(\d) ([a-z ]+) =", query)
    if match is None:
        raise ValueError(f"not a compose query: {query!r}")
    return int(match.group(1)), match.group(2).split()


def baselines(docs: list[dict]) -> dict:
    """Percent correct of every rule on ``docs`` (compose eval documents), per depth and over all:
    ``{"by_depth": {h: {rule: pct, "best": pct, "best_rule": rule, "n": n}}}``."""
    by_depth: dict[int, list[dict]] = {}
    for doc in docs:
        by_depth.setdefault(int(doc["depth"]), []).append(doc)
    out = {}
    for depth, items in sorted(by_depth.items()):
        golds = [int(d["choices"][d["gold"]]) for d in items]
        parsed = [parse(d["query"]) for d in items]
        n = len(items)
        score = lambda answers: 100.0 * sum(a == g for a, g in zip(answers, golds)) / n  # noqa: E731
        row = {"n": n, "most_common": 100.0 * Counter(golds).most_common(1)[0][1] / n,
               "start_digit": score([start for start, _ in parsed])}
        truncations = range(1, depth)
        row["last_m_moves"] = max((score([compose(s, m[-k:]) for s, m in parsed]) for k in truncations), default=0.0)
        row["first_m_moves"] = max((score([compose(s, m[:k]) for s, m in parsed]) for k in truncations), default=0.0)
        best = max(RULES, key=lambda rule: row[rule])
        row.update(best=row[best], best_rule=best)
        out[depth] = row
    return {"by_depth": out}
