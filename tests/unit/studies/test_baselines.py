"""``studies/baselines.py``: the trivial baselines of the compose items, each rule scored by hand (moved from
test_items.py), and a query that is not a compose query refused."""

from __future__ import annotations

import pytest

from megatron_loop.data.corpus_templates import COMPOSE_MOVES
from megatron_loop.studies.baselines import baselines, parse


def test_baselines_by_hand():
    """Each rule scored on two hand-made depth-2 items: the start digit, the last move alone, the first
    move alone, the most common answer."""
    f, g = COMPOSE_MOVES["f"], COMPOSE_MOVES["g"]
    docs = [{"query": f"{s} f g =", "choices": [str(i) for i in range(10)], "gold": g[f[s]], "depth": 2}
            for s in (0, 1)]
    got = baselines(docs)["by_depth"][2]
    expect_start = 100.0 * sum(g[f[s]] == s for s in (0, 1)) / 2
    expect_last = 100.0 * sum(g[f[s]] == g[s] for s in (0, 1)) / 2
    expect_first = 100.0 * sum(g[f[s]] == f[s] for s in (0, 1)) / 2
    assert got["start_digit"] == expect_start and got["last_m_moves"] == expect_last
    assert got["first_m_moves"] == expect_first
    assert got["most_common"] == (100.0 if g[f[0]] == g[f[1]] else 50.0)
    assert got["best"] == max(got[k] for k in ("most_common", "start_digit", "last_m_moves", "first_m_moves"))


def test_parse_reads_start_and_moves_or_refuses():
    assert parse("7 f g g =") == (7, ["f", "g", "g"])
    with pytest.raises(ValueError) as err:
        parse("17 f =")
    assert str(err.value) == "not a compose query: '17 f ='"
