"""``training/setup.py``'s parts that need no launcher: the loaders of this rank (sharded by its
data-parallel rank, validation opened only when the run validates), rank 0's hold on the output folder,
and the seeding. (``build_run`` as a whole: every training run of tests/integration/.)"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from megatron_loop.config import config_from_dict
from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.parallel.bootstrap import ensure_groups
from megatron_loop.model.placement import ParallelPlacement
from megatron_loop.training import preflight, setup
from megatron_loop.training.distributed import DistInfo
from megatron_loop.training.lock import LOCK_NAME
from megatron_loop.training.setup import data_loaders, seed_everything, take_output_dir
from probe_fixtures import write_prefix

RANK0 = DistInfo(0, 1, 0)


def _cfg(tmp_path, **train):
    for folder in ("train", "valid"):
        (tmp_path / folder).mkdir()
    train_prefix = write_prefix(tmp_path / "train", num_docs=40)
    valid_prefix = write_prefix(tmp_path / "valid", num_docs=12, seed=1)
    return config_from_dict({
        "model": {"backbone": "tiny-llama"},
        "train": {"seq_length": 16, "global_batch_size": 8, "micro_batch_size": 2, "eval_batches": 1, **train},
        "data": {"train_prefixes": [train_prefix], "valid_prefixes": [valid_prefix], "num_workers": 0}})


def test_loaders_read_the_validation_set_only_when_the_run_validates(tmp_path):
    cfg = _cfg(tmp_path, eval_interval=0)
    loaders = data_loaders(cfg, total_steps=3)
    assert loaders.valid is None and loaders.valid_prefixes == []
    cfg.train.eval_interval = 5
    loaders = data_loaders(cfg, total_steps=3)
    assert loaders.valid is not None and loaders.valid_prefixes == cfg.data.valid_prefixes
    assert next(iter(loaders.valid))["tokens"].shape[0] == 2  # micro-batches of 2
    sampler = loaders.train_sampler
    assert sampler.total_samples == 3 * 8 and len(sampler) == 3 * 4  # 3 steps x 4 micro-batches of 2


def test_loaders_are_sharded_by_the_data_parallel_rank_not_the_tensor_parallel_one(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, eval_interval=0)
    one_rank = [batch["tokens"] for batch in data_loaders(cfg, total_steps=2).train]
    assert len(one_rank) == 8
    seen = []
    for tp_rank in (0, 1):
        for dp_rank in (0, 1):
            monkeypatch.setattr(setup, "current_placement", lambda: ParallelPlacement(
                tp_size=2, tp_rank=tp_rank, dp_size=2, dp_rank=dp_rank))
            loaders = data_loaders(cfg, total_steps=2)
            assert (loaders.train_sampler.dp_rank, loaders.train_sampler.dp_size) == (dp_rank, 2)
            seen.append([batch["tokens"] for batch in loaders.train])
    assert all(torch.equal(a, b) for a, b in zip(seen[0], seen[2]))  # TP ranks of one DP rank: the same data
    # global batch g: DP rank 0 reads its first half, rank 1 the second (2 micro-batches each)
    for g in range(2):
        assert all(torch.equal(a, b) for a, b in zip(seen[0][2 * g:2 * g + 2], one_rank[4 * g:4 * g + 2]))
        assert all(torch.equal(a, b) for a, b in zip(seen[1][2 * g:2 * g + 2], one_rank[4 * g + 2:4 * g + 4]))


def test_rank0_holds_the_output_folder_and_releases_it_when_the_folder_is_not_writable(tmp_path, monkeypatch):
    ensure_groups()  # rank 0's decision is broadcast: here to itself
    out = tmp_path / "run"
    lock = take_output_dir(out, RANK0)
    assert (out / LOCK_NAME).is_file() and lock.still_ours()
    with pytest.raises(LoopConfigError, match="train.output_dir is in use by another run"):
        take_output_dir(out, RANK0)
    lock.release()

    def full(folder):
        raise LoopDataError(f"{folder}: no space left on device (ENOSPC)")

    monkeypatch.setattr(preflight, "check_writable", full)
    with pytest.raises(LoopDataError, match="no space left on device"):
        take_output_dir(out, RANK0)
    monkeypatch.undo()
    take_output_dir(out, RANK0).release()  # the failed start let go of the folder


def test_seed_everything_seeds_python_numpy_and_torch():
    def draws():
        return random.random(), float(np.random.rand()), float(torch.rand(()))

    seed_everything(42)
    first = draws()
    seed_everything(42)
    assert draws() == first
    seed_everything(43)
    assert all(a != b for a, b in zip(draws(), first))
    random.seed(42)
    np.random.seed(42)
    torch.manual_seed(42)
    assert draws() == first  # App. C.2's seed through each library's own generator
