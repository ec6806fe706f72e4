"""Train/validation DataLoaders from the typed ``data:`` section (App. C.1, SPEC "Data semantics").

:func:`build_train_valid_loaders` takes the :class:`~megatron_loop.config.DataConfig` itself and
reads these of its keys (the config layer has read and checked them):

``train_prefixes`` / ``train_weights``  the train blend (:meth:`DataConfig.train_blend`: weight 1
               each when the weights are null); component ``k`` is shuffled with seed ``seed + k``.
``valid_prefixes`` what validation reads (:meth:`DataConfig.validation_prefixes`: null is
               ``<first train prefix>_valid`` when its files exist, what ``tools/preprocess_data.py
               --validation-documents`` writes; ``[]`` is no validation), equal weights; opened only
               with ``validation=True`` (the training loop passes ``train.eval_interval > 0``).
``num_workers`` DataLoader worker processes.
``order``      ``stream`` (documents in the order preprocessing wrote them, as the paper trains,
               App. C.1) or ``shuffled`` (a seeded permutation per epoch); see ``packed.py``.

Batches are ``{"tokens": LongTensor[B, S]}``: the model takes ``tokens`` as its input and as its
labels and shifts them itself (HF ``labels=``), so the loss averages the ``S - 1`` next-token
predictions of each sequence (SPEC "Data semantics").
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader

from megatron_loop.config import DataConfig
from megatron_loop.data.blend import BlendedDataset, max_blend_samples, samples_needed
from megatron_loop.data.indexed import DataWatch, check_token_ids, count_tokens, open_indexed
from megatron_loop.data.packed import PackedDataset, epochs_for
from megatron_loop.data.sampler import GlobalBatchSampler
from megatron_loop.errors import SHARED_MEMORY, LoopDataError, os_error_text


def _packed(prefixes: list[tuple[str, float]], seq_length: int, seed: int, num_samples: int | None,
            vocab_size: int | None, order: str, usage: list[dict] | None = None) -> torch.utils.data.Dataset:
    """One PackedDataset per prefix (enough epochs for ``num_samples``), blended if several.

    Component ``k`` gets seed ``seed + k`` so two prefixes never share a document order.
    ``usage`` (when given) receives, per prefix, the samples the run reads from it and how many
    epochs of its tokens that is (data reuse).
    """
    for prefix, _ in prefixes:
        if vocab_size is not None:
            open_indexed(prefix)  # clear errors for a damaged prefix before scanning it
            check_token_ids(prefix, vocab_size)
    weights = [w for _, w in prefixes]
    if num_samples is None:
        # One pass: as many samples as the blend can take without exhausting any component.
        one_pass = [PackedDataset(p, seq_length, seed + k, 1, None, order)
                    for k, (p, _) in enumerate(prefixes)]
        if len(one_pass) == 1:
            return one_pass[0]
        return BlendedDataset(one_pass, weights, max_blend_samples([len(d) for d in one_pass], weights))
    needs = samples_needed(weights, num_samples) if len(prefixes) > 1 else [num_samples]
    datasets = []
    for k, ((prefix, weight), need) in enumerate(zip(prefixes, needs)):
        tokens = count_tokens(prefix)
        datasets.append(PackedDataset(prefix, seq_length, seed + k,
                                      epochs_for(tokens, seq_length, max(need, 1)), None, order))
        if usage is not None:
            usage.append({"prefix": prefix, "weight": weight, "tokens": tokens, "samples": need,
                          "epochs": need * seq_length / max(tokens, 1)})
    if len(datasets) == 1:
        return datasets[0]
    return BlendedDataset(datasets, weights, num_samples)


def collate_packed(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack packed sequences into one ``{"tokens": [B, S]}`` batch."""
    return {"tokens": torch.stack([x["tokens"] for x in items])}


@dataclass
class TrainValidLoaders:
    """What ``build_train_valid_loaders`` returns; ``valid`` is None without validation data."""

    train: DataLoader
    valid: DataLoader | None
    train_dataset: torch.utils.data.Dataset
    valid_dataset: torch.utils.data.Dataset | None
    train_sampler: GlobalBatchSampler
    # per train prefix: samples this run reads from it and the epochs of its tokens that makes
    # (filled when ``train_samples`` is given; see ``_packed``)
    train_usage: list[dict] | None = None
    # the prefixes the validation loader reads ([] without validation)
    valid_prefixes: list[str] = field(default_factory=list)
    # the data files as they were opened: a change under the live run is one error line (DataWatch)
    data_watch: DataWatch | None = None


def _loader(dataset, sampler: GlobalBatchSampler, num_workers: int, pin_memory: bool = False) -> DataLoader:
    return DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers,
                      collate_fn=collate_packed, persistent_workers=False, pin_memory=pin_memory)


def build_train_valid_loaders(data: DataConfig, *, seq_length: int, global_batch_size: int,
                              micro_batch_size: int, validation: bool = True, dp_rank: int = 0,
                              dp_size: int = 1, seed: int = 1234, consumed_samples: int = 0,
                              vocab_size: int | None = None,
                              train_samples: int | None = None,
                              pin_memory: bool | None = None) -> TrainValidLoaders:
    """DataLoaders for one data-parallel rank, from the typed ``data:`` section (module docstring).

    ``validation``: whether to open the validation prefixes at all (False: ``valid`` is None and
    a validation set smaller than a micro-batch cannot stop the run; the training loop passes
    ``train.eval_interval > 0``).
    ``train_samples``: total sequences the run will consume (``train_steps * global_batch_size``);
    datasets get enough epochs for it. ``None`` means one pass over the data. The train loader
    starts after ``consumed_samples`` (resume) and yields this rank's micro-batches of every
    global batch in order (``accumulation_steps`` per global batch). The validation loader
    yields micro-batches of ``micro_batch_size`` per rank over the validation set from its start.
    ``vocab_size``: when given, every prefix is checked for token ids >= vocab_size.
    ``pin_memory`` (None: when CUDA is available): batches come in page-locked memory, so that the
    training step's ``.to(device, non_blocking=True)`` is queued without the host waiting.
    """
    if not isinstance(data, DataConfig):
        raise TypeError(f"build_train_valid_loaders: expected the config's DataConfig (cfg.data), "
                        f"got {type(data).__name__}")
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    check_shared_memory(data.num_workers, micro_batch_size * seq_length * 8)  # the workers' batches go there
    train_prefixes = data.train_blend()
    usage: list[dict] = []
    train_ds = _packed(train_prefixes, seq_length, seed, train_samples, vocab_size, data.order, usage)
    total = len(train_ds) if train_samples is None else train_samples
    if len(train_ds) < global_batch_size:
        raise LoopDataError(f"data.train {[p for p, _ in train_prefixes]}: {len(train_ds)} sequences "
                            f"of seq_length {seq_length}; expected at least one global batch "
                            f"({global_batch_size})")
    sampler = GlobalBatchSampler(total, global_batch_size, micro_batch_size, dp_rank, dp_size,
                                 consumed_samples)

    valid_prefixes = data.validation_prefixes() if validation else []
    valid_ds = valid = None
    if valid_prefixes:
        valid_ds = _packed([(p, 1.0) for p in valid_prefixes], seq_length, seed, None, vocab_size, data.order)
        step = micro_batch_size * dp_size
        if len(valid_ds) < step:
            raise LoopDataError(f"data.valid_prefixes {valid_prefixes}: {len(valid_ds)} sequences "
                                f"of seq_length {seq_length}; expected at least micro_batch_size x data-parallel "
                                f"size = {step} for validation (or train without it: train.eval_interval=0 or "
                                "data.valid_prefixes=[])")
        valid = _loader(valid_ds, GlobalBatchSampler(len(valid_ds), step, micro_batch_size, dp_rank,
                                                     dp_size), data.num_workers, pin)
    watch = DataWatch([p for p, _ in train_prefixes])  # validation batches are read once, at the start
    return TrainValidLoaders(_loader(train_ds, sampler, data.num_workers, pin), valid, train_ds, valid_ds, sampler,
                             usage if train_samples is not None else None, valid_prefixes, watch)


# DataLoader workers hand each batch to the main process through shared memory (/dev/shm), up to
# prefetch_factor (2) batches per worker at a time; their queues' semaphores live there too.
PREFETCH = 2


def shared_memory_free() -> tuple[int, int] | None:
    """(free, total) bytes of /dev/shm, or None where there is none."""
    import shutil

    try:
        usage = shutil.disk_usage(SHARED_MEMORY)
    except OSError:
        return None
    return usage.free, usage.total


def check_shared_memory(num_workers: int, batch_bytes: int) -> None:
    """Before the workers start: room in /dev/shm for the batches they hold (a full /dev/shm was
    reported as a full output folder, and the DataLoader's own half-built iterator then raised an
    AttributeError as it was collected)."""
    room = shared_memory_free() if num_workers > 0 else None
    if room is None:
        return
    need = max(1 << 20, 2 * num_workers * PREFETCH * batch_bytes)
    if room[0] < need:
        raise LoopDataError(shared_memory_text(num_workers, f"{room[0] / 2**20:,.1f} MiB free of "
                                                            f"{room[1] / 2**20:,.0f} MiB, about {need / 2**20:,.1f} MiB "
                                                            "needed"))


def shared_memory_text(num_workers: int, detail: str) -> str:
    return (f"data.num_workers={num_workers}: shared memory ({SHARED_MEMORY}) is full ({detail}): the DataLoader "
            f"workers pass their batches through {SHARED_MEMORY}; give the job more shared memory (docker run "
            "--shm-size, a larger /dev/shm) or set data.num_workers: 0")


def measure_loader_throughput(prefix: str, seq_length: int = 2048, micro_batch_size: int = 8,
                              num_batches: int = 200, seed: int = 1234, num_workers: int = 0,
                              cache_dir: str | None = None) -> dict:
    """Samples/s and tokens/s of the train loader reading ``prefix`` (run it twice to measure
    from the page cache). Returns ``{"samples_per_s", "tokens_per_s", "batches",
    "index_build_s"}``; ``index_build_s`` is the packing-index build (or cache load) time."""
    start = time.perf_counter()
    ds = PackedDataset(prefix, seq_length, seed, 1, cache_dir)
    index_s = time.perf_counter() - start
    n = min(num_batches, len(ds) // micro_batch_size)
    if n < 1:
        raise LoopDataError(f"{prefix}: fewer than {micro_batch_size} sequences of {seq_length} tokens")
    loader = _loader(ds, GlobalBatchSampler(n * micro_batch_size, micro_batch_size,
                                            micro_batch_size), num_workers)
    start = time.perf_counter()
    samples = sum(len(b["tokens"]) for b in loader)
    seconds = time.perf_counter() - start
    return {"samples_per_s": samples / seconds, "tokens_per_s": samples * seq_length / seconds,
            "batches": n, "index_build_s": index_s}


# ----------------------------------------------------------------------------- worker failures


class LoaderFailure(RuntimeError):
    """A DataLoader worker died or stopped producing batches; the message is the one line to print."""


class LoaderStalled(LoaderFailure):
    """No batch from the DataLoader workers within ``data.worker_timeout_s``."""


class SupervisedBatches:
    """The batches of ``loader``, each awaited at most ``timeout_s`` seconds (``data.worker_timeout_s``).

    A worker that hung or was stopped (SIGSTOP) blocks the main process in places torch's own
    ``DataLoader(timeout=...)`` does not cover: the tensors of a batch arrive as file descriptors
    that the receiver fetches from the worker's sharing thread, a blocking read. A real-time
    timer (SIGALRM) interrupts any wait; its handler raises :class:`LoaderStalled`, which the
    interrupted call propagates (PEP 475). Only with workers and in the main thread (where
    signal handlers run); otherwise batches are passed through unchanged.
    """

    def __init__(self, loader: DataLoader, timeout_s: float, watch: DataWatch | None = None) -> None:
        import threading

        try:
            self._batches = iter(loader)  # starts the workers: their queues live in /dev/shm
        except OSError as e:
            room = shared_memory_free()
            detail = os_error_text(e) + (f"; {room[0] / 2**20:,.1f} MiB free of {room[1] / 2**20:,.0f} MiB" if room
                                         else "")
            raise LoopDataError(shared_memory_text(loader.num_workers, detail)) from None
        self.watch = watch  # the data files as they were opened: checked before every batch
        self.num_workers = loader.num_workers
        self.timeout_s = timeout_s
        self._armed = loader.num_workers > 0 and threading.current_thread() is threading.main_thread()

    def __iter__(self) -> "SupervisedBatches":
        return self

    def _expired(self, signum: int, frame) -> None:  # noqa: ARG002 - signal handler signature
        raise LoaderStalled(f"data.worker_timeout_s={self.timeout_s:g}: no batch from the DataLoader workers "
                            f"(data.num_workers={self.num_workers}) within {self.timeout_s:g} s: a worker hung "
                            "or was stopped")

    def exit_codes(self) -> dict[int, int | None]:
        """pid -> exit code of this iterator's worker processes (a negative code: the signal).
        torch keeps them in the iterator's private ``_workers``; without it, no codes."""
        return {w.pid: w.exitcode for w in getattr(self._batches, "_workers", [])}

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.watch is not None:
            self.watch.check()
        if not self._armed:
            return next(self._batches)
        previous = signal.signal(signal.SIGALRM, self._expired)
        signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
        try:
            return next(self._batches)
        except RuntimeError as e:
            if self.watch is not None:  # a worker's SIGBUS from a data file changed in place: that file, one line
                self.watch.check()
            if (why := loader_failure(e, self.num_workers, self.exit_codes(), self.watch)) is not None:
                raise LoaderFailure(why) from None
            raise
        except (ConnectionError, EOFError):
            # A worker killed while the main process fetches a batch's tensors from it: the
            # descriptor handshake sees the closed socket before torch's SIGCHLD check runs.
            if self.watch is not None:
                self.watch.check()
            if (why := self._dead_worker()) is not None:
                raise LoaderFailure(why) from None
            raise
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def _dead_worker(self, wait_s: float = 2.0) -> str | None:
        """The one-line cause when a worker has died (its exit code may lag the broken socket)."""
        import time

        deadline = time.monotonic() + wait_s
        while True:
            dead = {pid: code for pid, code in self.exit_codes().items() if code is not None}
            if dead:
                pid, code = next(iter(dead.items()))
                return loader_failure(RuntimeError(f"DataLoader worker (pid {pid}) exited unexpectedly with exit "
                                                   f"code {code}"), self.num_workers, watch=self.watch)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)


_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: (.+?)\.?\s*$")
_EXITED = re.compile(r"DataLoader worker \(pid\(?s?\)? ([\d, ]+)\) exited unexpectedly(?: with exit code (-?\d+))?")


def _killed_text(pid: str, name: str, num_workers: int, watch: DataWatch | None = None) -> str:
    """The hint fits the signal: the out-of-memory killer's SIGKILL is memory; a SIGBUS is a data file
    changed under its memory map (named) or a full /dev/shm (said only when it is full); nothing is
    guessed for other signals."""
    name = name.split(". ")[0]  # torch appends its shared-memory guess to every "Bus error"
    killed = f"data.num_workers={num_workers}: DataLoader worker (pid {pid}) was killed by signal"
    if name in ("Killed", "SIGKILL"):
        return (f"{killed} SIGKILL (Killed; the kernel's out-of-memory killer sends it: see dmesg); with too little "
                "memory lower data.num_workers or give the job more memory")
    if name in ("Bus error", "SIGBUS"):
        changed = watch.problem() if watch is not None else None
        if changed is not None:
            return changed
        room = shared_memory_free()
        if room is not None and room[0] < max(1 << 20, room[1] // 100):
            return shared_memory_text(num_workers, f"{room[0] / 2**20:,.1f} MiB free of {room[1] / 2**20:,.0f} MiB; "
                                                   f"a worker was killed by SIGBUS (pid {pid})")
        return f"{killed} SIGBUS (Bus error: a memory-mapped file shrank under it, or shared memory ran out)"
    return f"{killed} {name}"


def loader_failure(error: BaseException, num_workers: int,
                   exit_codes: dict[int, int | None] | None = None, watch: DataWatch | None = None) -> str | None:
    """One line for a DataLoader worker that died (torch reports it as a bare ``RuntimeError``,
    from its SIGCHLD handler or, when its status check comes first, without the cause:
    ``exit_codes`` (pid -> exit code) recovers it) or stopped producing batches; None for any
    other error."""
    if isinstance(error, LoaderFailure):
        return str(error)
    text = str(error).strip()
    if m := _KILLED.search(text):
        return _killed_text(m.group(1), m.group(2), num_workers, watch)
    if m := _EXITED.search(text):
        pid = m.group(1).strip()
        code = m.group(2)
        if code is None and pid.isdigit():
            code = (exit_codes or {}).get(int(pid))
        if code is not None and int(code) < 0:
            return _killed_text(pid, signal.Signals(-int(code)).name, num_workers, watch)
        code = f" with exit code {code}" if code is not None else ""
        return f"data.num_workers={num_workers}: DataLoader worker (pid {pid}) exited unexpectedly{code}"
    return None


def end_loader_workers(join_s: float = 5.0) -> None:
    """SIGKILL every DataLoader worker of this process that is still alive (an error path).

    The workers ignore stop signals (``training.signals.ignore_stop_signals_in_worker``), and an
    iterator kept alive by the traceback is not shut down before Python's exit handlers join
    every child process: without this, an error with a worker alive never exits. The workers
    only read data, so nothing is lost. torch's SIGCHLD handler is reset first: it would raise
    "DataLoader worker ... killed" for the very workers ended here."""
    import multiprocessing

    children = multiprocessing.active_children()
    if not children:
        return
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()
    for child in children:
        child.join(join_s)
