"""The CPU host-sync detector (``measure.host_sync.HostSyncDetector``) sees what makes a GPU step wait for the
device -- scalar reads, ``.tolist()``/``.numpy()``, host-to-device copies from pageable memory and
copies of tensors built on the host in the step -- and a training step (forward, loss, backward
under every recomputation mode), the Muon step and the batch path make none."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megatron_loop import build_model
from megatron_loop.config import build_model_config
from megatron_loop.optim import MuonAdamW, role_param_groups
from megatron_loop.measure import host_sync
from megatron_loop.measure.host_sync import find_host_syncs
from megatron_loop.model.recompute import RecomputeSettings
from megatron_loop.parallel.parallelize import apply_recompute

PAGEABLE = "host-to-device copy from pageable memory"
HOST_BUILT = "host-to-device copy of a tensor built on the host"
READ = "reads the tensor on the host"


@pytest.mark.parametrize("probe, kind", [
    (lambda t: t.tolist(), READ),
    (lambda t: t.numpy(), READ),
    (lambda t: np.asarray(t), READ),
    (lambda t: t.sum().item(), "_local_scalar_dense"),
    (lambda t: t.to(t.device), PAGEABLE),  # a blocking copy (on GPU: from pageable memory)
    (lambda t: t.to(device=t.device, dtype=torch.float64), PAGEABLE),
    (lambda t: t + torch.arange(8).to(t.device, non_blocking=True), HOST_BUILT),  # rebuilt on the host each step
    (lambda t: t + (torch.arange(8) * 2).flip(0).to(t, non_blocking=True), HOST_BUILT),  # and what is made of it
    (lambda t: t + torch.tensor([1.0]), "host data entering the step"),
    (lambda t: t.to(t.device, non_blocking=True), None),  # a queued copy (pinned on GPU)
    (lambda t: t + torch.zeros(8, device=t.device).to(t.device, non_blocking=True), None),  # built on the device
    (lambda t: t + torch.arange(8, device=t.device), None),  # built on the device
    (lambda t: t.to(torch.float64) + 1, None),  # a dtype conversion stays where it is
    (lambda t: torch.from_numpy(np.ones(8)).to(t.device, non_blocking=True), None),  # loaded data, queued copy
])
def test_detector_catches_each_kind(probe, kind):
    t = torch.randn(8)
    found = find_host_syncs(lambda: probe(t))
    if kind is None:
        assert found == []
    else:
        assert len(found) == 1 and kind in found[0], found
        assert "tests/unit/measure/test_host_sync.py" in found[0]  # it names the line that did it


def test_unpinned_source_is_pageable_where_pinning_exists(monkeypatch):
    """With CUDA, ``non_blocking=True`` is not enough: from pageable memory the copy still waits."""
    t = torch.randn(8)
    monkeypatch.setattr(host_sync, "pinning_available", lambda: True)
    found = find_host_syncs(lambda: t.to(t.device, non_blocking=True))
    assert len(found) == 1 and PAGEABLE in found[0], found


@pytest.mark.parametrize("probe, syncs", [
    (lambda t: t.sum().item(), True), (lambda t: bool(t.sum() > 0), True), (lambda t: int(t.argmax()), True),
    (lambda t: t[t > 0], True), (lambda t: torch.nonzero(t), True), (lambda t: t + torch.tensor([1.0]), True),
    (lambda t: t.sum() + 1, False), (lambda t: torch.where(t > 0, t, 0.0).sum(), False)])
def test_host_sync_detector(probe, syncs):
    """The CPU detector sees what .item(), bool(t), int(t), boolean masks and host tensors call."""
    found = find_host_syncs(lambda: probe(torch.randn(8)))
    assert bool(found) == syncs, found
    if syncs:
        assert "tests/unit/measure/test_host_sync.py" in found[0]  # it names the line that synchronised


@pytest.mark.parametrize("mode", ["per_loop", "selective", "auto"])
def test_training_step_reads_nothing_back_to_the_host(mode):
    """No op inside forward + loss + backward reads a device value on the host (the CPU stand-in
    for CUDA's sync debug mode, which the benchmark uses on GPU; the engine's step is checked
    under ZeRO-3 in tests/support/perf_scripts/fused_loss.py)."""
    cfg = build_model_config(dict(backbone="tiny-qwen", prelude_layers=1, core_layers=1, coda_layers=1,
                                  train_loops=3, timestep="loop_gating", initial_injection="channel",
                                  history_injection="scalar", history_window=2, recompute=mode,
                                  recompute_budget_gib=1e-3 if mode == "auto" else None))
    model = build_model(cfg)
    apply_recompute(model, RecomputeSettings.from_config(cfg))
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    model(x, labels=x, compute_logits=False)  # the first call builds the cached constants and plans
    assert find_host_syncs(lambda: model(x, labels=x, compute_logits=False).loss.backward()) == []


def test_muon_step_copies_nothing_to_the_device():
    """The fused QKV and gate/up projections' row indices are built once on the device: no Muon
    step (the first included) builds them on the host and copies them over."""
    model = build_model(build_model_config(dict(backbone="tiny-qwen", core_layers=2, train_loops=2)))
    muon = [g for g in role_param_groups(model) if g["muon"]]
    optimizer = MuonAdamW(muon, lr=1e-2)  # AdamW's host step counter is torch's own (a host scalar by design)
    x = torch.randint(0, 2048, (2, 8))
    for _ in range(2):
        model(x, labels=x, compute_logits=False).loss.backward()
        assert find_host_syncs(optimizer.step) == []
        optimizer.zero_grad()


def test_loaders_pin_batches_when_cuda_is_there(monkeypatch):
    from data_fixtures import data_assets
    from megatron_loop.config import DataConfig
    from megatron_loop.data.loaders import build_train_valid_loaders

    data = DataConfig(train_prefixes=[data_assets().prefix], num_workers=0, order="shuffled")

    def loaders():
        return build_train_valid_loaders(data, seq_length=32, global_batch_size=4, micro_batch_size=2)

    cpu = loaders()
    assert not cpu.train.pin_memory and not cpu.valid.pin_memory
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cuda = loaders()  # not iterated: pinning needs the device
    assert cuda.train.pin_memory and cuda.valid.pin_memory


def test_cuda_sync_warnings_leave_out_torchs_notice_on_the_mode():
    """On an H200 the first case measured reported one sync: torch's notice that the debug mode is a
    prototype, not a synchronisation. Only the warnings that report a synchronising call count."""
    import warnings

    from megatron_loop.measure.host_sync import sync_warnings

    def warning(text):
        return warnings.WarningMessage(UserWarning(text), UserWarning, "f.py", 1)

    caught = [warning("Synchronization debug mode is a prototype feature and does not yet detect all "
                      "synchronizing operations (Triggered internally at Module.cpp:1003.)"),
              warning("called a synchronizing CUDA operation (Triggered internally at CUDAFunctions.cpp:151.)"),
              warning("an unrelated warning")]
    assert [str(w.message) for w in sync_warnings(caught)] == [str(caught[1].message)]
