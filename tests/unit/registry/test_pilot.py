"""``registry/pilot.py``: the optimizer pilot of App. D.1 (Table 7): six architectures, each with AdamW and
with Muon, the peer designs with their own keys, assumptions named (the rendered files: tests/unit/registry/
test_registry.py)."""

from __future__ import annotations

from megatron_loop.eval.tasks import PAPER_TASKS, PILOT_TASKS, resolve_tasks
from megatron_loop.registry.pilot import PILOT_SUITE, is_pilot, pilot_runs


def test_six_architectures_twice():
    runs = pilot_runs()
    assert len(runs) == 12 and all(is_pilot(r) for r in runs)
    assert [r.name for r in runs[:2]] == ["pilot_nonloop_12x1_adamw", "pilot_nonloop_12x1_muon"]
    assert sorted({r.name.rsplit("_", 1)[0] for r in runs}) == sorted(
        f"pilot_{a}" for a in ("nonloop_12x1", "nonloop_3x1", "baseloop_3x4", "loopformer_3x4", "ouro_3x4",
                               "huginn_1+2x5+1"))
    for run in runs:
        train = dict(run.train)
        assert train["optimizer"] == ("adamw" if run.name.endswith("_adamw") else "muon_adamw")
        assert train["train_tokens"] is None  # the assumed budget: tokens per parameter
        assert run.paper_params is None and run.note.startswith("App. D.1 names neither backbone nor budget")


def test_peer_designs_carry_their_own_keys():
    by_name = {r.name: r for r in pilot_runs()}
    huginn = by_name["pilot_huginn_1+2x5+1_muon"]
    assert dict(huginn.model) == {"block_norm": "sandwich", "norm_core_output": True, "initial_state": "noise"}
    assert dict(huginn.train)["loop_sampling"] == "poisson_lognormal" and dict(huginn.train)["backprop_loops"] == 2
    assert huginn.conditioning.initial == "dense" and huginn.layout == "1+2x5+1"
    assert dict(by_name["pilot_ouro_3x4_adamw"].model) == {"exit_gate": "learned"}
    assert by_name["pilot_loopformer_3x4_adamw"].conditioning.timestep == "shortcut"


def test_the_pilot_suite_is_table_7s_columns_and_known_tasks():
    assert len(PILOT_SUITE) == 10 and len(set(PILOT_SUITE)) == 10
    assert set(PILOT_SUITE) - set(PAPER_TASKS) == set(PILOT_TASKS) == {"mmlu", "race"}  # App. C.3's suite has neither
    assert [t.key for t in resolve_tasks(list(PILOT_SUITE))] == list(PILOT_SUITE)  # --tasks of the pilot's sweep
