"""``hf/modeling_looplm.py``'s recurrence, written once: the training model and the export run the same
``Recurrence`` and ``loop_transition`` objects (asserted by identity and by counting their calls from both
models), the loop's bookkeeping (the history window each loop reads, the trajectory), and one list of each
option: the config's and the modeling file's agree, and so do the other places that name them. (Equal
logits after export: tests/integration/hf/test_export.py.)"""

from __future__ import annotations

import ast
import types

import torch

from megatron_loop.config import build_model_config
from megatron_loop.config import validation
from megatron_loop.hf import modeling_looplm as export
from megatron_loop.model import build_model, looplm, recompute
from testpaths import REPO


def _counting(monkeypatch, owner, name) -> list:
    calls, real = [], getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_the_training_model_and_the_export_run_the_same_recurrence(monkeypatch):
    assert looplm.Recurrence is export.Recurrence and looplm.loop_transition is export.loop_transition
    runs = _counting(monkeypatch, export.Recurrence, "run")
    steps = []
    real_transition = export.loop_transition

    def transition(model, *args):
        steps.append(type(model).__name__)
        return real_transition(model, *args)

    monkeypatch.setattr(export, "loop_transition", transition)
    monkeypatch.setattr(looplm, "loop_transition", transition)  # the name the training model imported
    cfg = build_model_config(dict(backbone="tiny-llama", core_layers=1, train_loops=3, history_injection="scalar",
                                  timestep="loop_gating"))
    ids = torch.randint(0, cfg.vocab_size, (1, 6))
    build_model(cfg).eval()(ids, num_loops=3)
    hf = export.LoopLMForCausalLM(export.LoopLMConfig(core_layers=1, train_loops=3, history_injection="scalar",
                                                      timestep="loop_gating", vocab_size=cfg.vocab_size)).eval()
    hf(ids, num_loops=3, use_cache=False)
    assert [type(r).__name__ for r in runs] == ["Recurrence", "Recurrence"]
    assert steps == ["LoopLM"] * 3 + ["LoopLMModel"] * 3  # each loop of both through the one transition


def test_each_loop_reads_its_history_window_and_the_trajectory_keeps_every_state():
    seen = []

    def step(loop, h, h0, psi, past):
        seen.append((loop, [float(p) for p in past], float(psi)))
        return h + 1

    cfg = types.SimpleNamespace(history_injection="scalar", history_window=2, initial_state="prelude")
    loops = export.Recurrence(cfg, step, 5, psi=torch.arange(5, dtype=torch.float64) / 10, keep_trajectory=True, keep_states=True)
    assert float(loops.run(torch.tensor(0.0))) == 5
    # h_l's window: h_{l-1}, ..., h_{l-m_l}, m_l = min(w, max(l - 1, 0)) (h0 excluded), newest first
    assert seen == [(0, [], 0.0), (1, [], 0.1), (2, [1.0], 0.2), (3, [2.0, 1.0], 0.3), (4, [3.0, 2.0], 0.4)]
    assert [float(h) for h in loops.trajectory] == [0, 1, 2, 3, 4, 5] and len(loops.states) == 5


def test_one_list_of_each_option_and_every_place_that_names_them_agrees():
    for name in ("INITIAL_INJECTIONS", "HISTORY_INJECTIONS", "TIMESTEPS", "TIMESTEP_GRIDS", "EXIT_GATES",
                 "LOOP_GATING_REFERENCES", "BLOCK_NORMS", "INITIAL_STATES"):
        assert getattr(validation, name) == getattr(export, name), name  # the config's and the export's
    assert recompute.MODES is validation.RECOMPUTE_MODES
    from megatron_loop.eval import adaptive

    assert ("none", *adaptive.EXIT_CRITERIA) == export.EXIT_CRITERIA
    tree = ast.parse((REPO / "megatron_loop" / "eval" / "cli.py").read_text())  # tools/eval_loops.py runs it
    choices = [ast.literal_eval(k.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
               and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "--exit-criterion"
               for k in node.keywords if k.arg == "choices"]
    assert choices == [export.EXIT_CRITERIA]
    config_doc = (REPO / "docs" / "CONFIG.md").read_text()
    for key, allowed in validation.CHOICES.items():
        row = next(line for line in config_doc.splitlines() if line.startswith(f"| `{key.split('.', 1)[1]}` |"))
        assert all(f"`{value}`" in row or f"'{value}'" in row for value in allowed), (key, row[:200])
