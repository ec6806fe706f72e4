"""eval/harness.py: the sweep's lm-eval TaskManager indexes lm-eval's ~14,700 stock task YAMLs only
when a stock task is asked for (``include_defaults=False`` otherwise: seconds of every sweep's start)."""

from __future__ import annotations

from megatron_loop.eval import harness


def test_local_tasks_only_skip_the_stock_catalogue(tmp_path, monkeypatch):
    (tmp_path / "my_local.yaml").write_text("task: my_local\ndataset_path: json\noutput_type: multiple_choice\n")
    local = harness.task_manager([str(tmp_path)], names={"looplm_clutrr", "my_local"})
    assert {"looplm_clutrr", "looplm_proofwriter", "my_local"} <= set(local.all_tasks)
    assert "arc_easy" not in local.all_tasks and len(local.all_tasks) < 100  # ours and the folder only
    assert harness.task_manager([str(tmp_path)], names={"my_local"}) is local  # one index per folder set

    # a stock task asked, or no names: the whole catalogue (built elsewhere: test_tasks.py; seconds)
    real, built = harness._task_manager, []

    def spy(paths, include_defaults):
        built.append((paths, include_defaults))
        return "full manager" if include_defaults else real(paths, include_defaults=include_defaults)

    monkeypatch.setattr(harness, "_task_manager", spy)
    folder = (str(tmp_path.resolve()),)
    assert harness.task_manager([str(tmp_path)], names={"my_local", "arc_easy"}) == "full manager"
    assert harness.task_manager([str(tmp_path)]) == "full manager"
    assert built == [(folder, False), (folder, True), (folder, True)]
