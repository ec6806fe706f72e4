"""``data/loaders.py``: a worker that died or shared memory that ran out as one line fitting the cause, and
the packed batch (the loaders in training runs and the workers killed for real:
tests/integration/training/test_train_loop.py, tests/integration/reliability/test_errors.py)."""

from __future__ import annotations

import pytest
import torch

from megatron_loop.data import loaders
from megatron_loop.data.loaders import (LoaderStalled, check_shared_memory, collate_packed, loader_failure,
                                        shared_memory_text)
from megatron_loop.errors import LoopDataError


def test_collate_stacks_packed_sequences():
    batch = collate_packed([{"tokens": torch.arange(4)}, {"tokens": torch.arange(4, 8)}])
    assert list(batch) == ["tokens"] and torch.equal(batch["tokens"], torch.arange(8).view(2, 4))


def test_torchs_worker_errors_become_one_line():
    oom = RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")
    assert loader_failure(oom, 2) == ("data.num_workers=2: DataLoader worker (pid 4242) was killed by signal SIGKILL "
                                      "(Killed; the kernel's out-of-memory killer sends it: see dmesg); with too little "
                                      "memory lower data.num_workers or give the job more memory")
    assert loader_failure(RuntimeError("DataLoader worker (pid 7) is killed by signal: Segmentation fault. "), 1) == \
        "data.num_workers=1: DataLoader worker (pid 7) was killed by signal Segmentation fault"
    exited = RuntimeError("DataLoader worker (pid(s) 99) exited unexpectedly")
    assert loader_failure(exited, 4) == "data.num_workers=4: DataLoader worker (pid 99) exited unexpectedly"
    assert loader_failure(exited, 4, exit_codes={99: 3}) == \
        "data.num_workers=4: DataLoader worker (pid 99) exited unexpectedly with exit code 3"
    assert loader_failure(exited, 4, exit_codes={99: -9}).startswith(  # a signal recovered from the exit code
        "data.num_workers=4: DataLoader worker (pid 99) was killed by signal SIGKILL (Killed;")
    assert loader_failure(LoaderStalled("stalled for 60 s"), 2) == "stalled for 60 s"
    assert loader_failure(ValueError("something else"), 2) is None


def test_a_bus_error_names_a_changed_file_first(monkeypatch):
    class Watch:
        def problem(self):
            return "data.train_prefixes[0]: p.bin changed while training read it"

    bus = RuntimeError("DataLoader worker (pid 5) is killed by signal: Bus error. It is possible that dataloader's "
                       "workers are out of shared memory.")
    assert loader_failure(bus, 2, watch=Watch()) == "data.train_prefixes[0]: p.bin changed while training read it"
    monkeypatch.setattr(loaders, "shared_memory_free", lambda: (10 << 30, 64 << 30))  # plenty free: not guessed
    assert loader_failure(bus, 2) == ("data.num_workers=2: DataLoader worker (pid 5) was killed by signal SIGBUS (Bus "
                                      "error: a memory-mapped file shrank under it, or shared memory ran out)")
    monkeypatch.setattr(loaders, "shared_memory_free", lambda: (0, 64 << 20))
    assert loader_failure(bus, 2) == shared_memory_text(2, "0.0 MiB free of 64 MiB; a worker was killed by SIGBUS "
                                                           "(pid 5)")


def test_shared_memory_checked_for_the_batches_workers_hold(monkeypatch):
    monkeypatch.setattr(loaders, "shared_memory_free", lambda: (3 << 20, 64 << 20))
    check_shared_memory(0, 1 << 30)  # no workers: nothing passes through /dev/shm
    check_shared_memory(2, 1 << 18)  # 2 x 2 workers x 2 prefetched x 256 KiB = 2 MiB < 3 MiB
    with pytest.raises(LoopDataError) as err:
        check_shared_memory(2, 1 << 19)  # 4 MiB needed
    assert str(err.value) == ("data.num_workers=2: shared memory (/dev/shm) is full (3.0 MiB free of 64 MiB, about "
                              "4.0 MiB needed): the DataLoader workers pass their batches through /dev/shm; give the "
                              "job more shared memory (docker run --shm-size, a larger /dev/shm) or set "
                              "data.num_workers: 0")
