"""``training/agreement.py``: the first key where a rank's settings differ from rank 0's, and the one line
every rank stops with. The collectives are the project's own wrappers (``training/distributed.py``),
replaced here by the answers three ranks would give; the real multi-rank refusal:
tests/integration/reliability/test_rank_agreement.py."""

from __future__ import annotations

import pytest

from megatron_loop.errors import LoopConfigError
from megatron_loop.training import agreement
from megatron_loop.training.agreement import _show, check_ranks_agree, first_difference
from megatron_loop.training.distributed import DistInfo


def test_first_difference_in_rank_0s_key_order_then_extra_keys():
    ref = {"train.lr": 0.1, "train.seq_length": 128, "model.core_layers": 2}
    assert first_difference(ref, dict(ref)) is None
    assert first_difference(ref, {**ref, "train.seq_length": 64, "model.core_layers": 3}) == ("train.seq_length", 64)
    assert first_difference(ref, {"train.lr": 0.1, "train.seq_length": 128}) == ("model.core_layers", "(missing)")
    assert first_difference(ref, {**ref, "extra": 1}) == ("extra", 1)


def test_show_is_sorted_json_cut_at_120_characters():
    assert _show({"b": 1, "a": [1, 2]}) == '{"a": [1, 2], "b": 1}'
    long = _show("x" * 500)
    assert len(long) == 120 and long.endswith("...")


def test_one_rank_checks_nothing(monkeypatch):
    monkeypatch.setattr(agreement, "run_fingerprint", lambda *a: pytest.fail("a single rank compares nothing"))
    check_ranks_agree(None, None, DistInfo(rank=0, world_size=1, local_rank=0))


def _three_ranks(monkeypatch, fingerprints):
    """Rank 0 runs the check; the gathered reports are what ranks 0..2 find against rank 0's fingerprint."""
    monkeypatch.setattr(agreement, "run_fingerprint", lambda cfg, ds: fingerprints[0])
    monkeypatch.setattr(agreement.D, "broadcast_object", lambda obj: obj)
    reports = [None if (f := first_difference(fingerprints[0], fp)) is None else (f[0], _show(f[1]))
               for fp in fingerprints]
    monkeypatch.setattr(agreement.D, "all_gather_object", lambda mine: [mine, *reports[1:]])


def test_every_rank_stops_with_the_key_and_the_ranks_that_differ(monkeypatch):
    base = {"train.lr": 0.001, "train.zero_stage": 1, "data.tokenizer='tok' (sha256 of its files)": "ab"}
    _three_ranks(monkeypatch, [base, {**base, "train.zero_stage": 2}, {**base, "train.zero_stage": 2}])
    with pytest.raises(LoopConfigError) as err:
        check_ranks_agree(None, None, DistInfo(rank=0, world_size=3, local_rank=0))
    assert str(err.value) == ("the ranks run different settings: train.zero_stage=1 on rank 0, 2 on ranks 1, 2; "
                              "expected every rank to run the same config, DeepSpeed JSON, data and tokenizer (the "
                              "same YAML, --set overrides and files on every node)")


def test_ranks_differing_in_another_key_are_named_too(monkeypatch):
    base = {"train.lr": 0.001, "train.seq_length": 128}
    _three_ranks(monkeypatch, [base, {**base, "train.lr": 0.002}, {**base, "train.seq_length": 64}])
    with pytest.raises(LoopConfigError) as err:
        check_ranks_agree(None, None, DistInfo(rank=0, world_size=3, local_rank=0))
    assert str(err.value).startswith("the ranks run different settings: train.lr=0.001 on rank 0, 0.002 on rank 1 "
                                     "(ranks 2 differ first in other keys); expected")


def test_agreeing_ranks_pass(monkeypatch):
    base = {"train.lr": 0.001}
    _three_ranks(monkeypatch, [base, dict(base), dict(base)])
    check_ranks_agree(None, None, DistInfo(rank=0, world_size=3, local_rank=0))
