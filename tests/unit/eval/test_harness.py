"""eval/harness.py: the sweep's lm-eval TaskManager indexes lm-eval's ~14,700 stock task YAMLs only
when a stock task is asked for (``include_defaults=False`` otherwise: seconds of every sweep's start)."""

from __future__ import annotations

import json

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


def test_task_data_files_are_read_from_the_yaml_folder_and_outside_ones_are_named(tmp_path, capsys):
    """tools/make_corpus.py names a task's items relative to its YAML (a copied corpus reads its own);
    the sweep resolves them against the YAML's folder, not the working directory. An absolute path
    outside the folder is read as written, with one line naming it."""
    from megatron_loop.data.corpus import lm_eval_task_yaml

    folder, elsewhere = tmp_path / "corpus" / "eval", tmp_path / "elsewhere"
    folder.mkdir(parents=True)
    elsewhere.mkdir()
    rows = [{"query": f"q{i}", "choices": ["a", "b"], "gold": i % 2} for i in range(3)]
    for path in (folder / "facts.jsonl", elsewhere / "facts.jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "facts.yaml").write_text(lm_eval_task_yaml("facts", folder / "facts.jsonl"))
    assert 'test: "facts.jsonl"' in (folder / "facts.yaml").read_text()
    outside = (folder / "facts.yaml").read_text().replace('"facts.jsonl"', f'"{elsewhere / "facts.jsonl"}"')
    (folder / "other.yaml").write_text(outside.replace("task: looplm_facts_local", "task: looplm_other_local"))
    manager = harness.task_manager([str(folder)], names={"looplm_facts_local", "looplm_other_local"})
    spec = harness.located_spec(manager, "looplm_facts_local")
    assert spec["dataset_kwargs"]["data_files"] == {"test": str(folder.resolve() / "facts.jsonl")}
    assert capsys.readouterr().err == ""
    assert harness.located_spec(manager, "looplm_other_local")["dataset_kwargs"]["data_files"] == {
        "test": str(elsewhere / "facts.jsonl")}
    assert capsys.readouterr().err == (f"note: lm-eval task 'looplm_other_local' ({folder.resolve() / 'other.yaml'}) "
                                       f"reads {elsewhere / 'facts.jsonl'}: an absolute path outside the task's "
                                       "folder, read as written\n")
    assert harness.located_spec(manager, "looplm_clutrr") == "looplm_clutrr"  # no local data files: by name
