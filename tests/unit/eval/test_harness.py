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
    """tools/make_corpus.py names a task's items by absolute path (plain lm_eval works from anywhere).
    The sweep reads a path inside the YAML's folder as written; an absolute path outside it (the folder
    was copied or moved) from the file of that name beside the YAML when there is one, else as written,
    each with one line naming what is read; a relative path from the YAML's folder, not the cwd."""
    from megatron_loop.data.corpus import lm_eval_task_yaml

    folder, elsewhere = tmp_path / "corpus" / "eval", tmp_path / "elsewhere"
    folder.mkdir(parents=True)
    elsewhere.mkdir()
    rows = [{"query": f"q{i}", "choices": ["a", "b"], "gold": i % 2} for i in range(3)]
    for path in (folder / "facts.jsonl", elsewhere / "facts.jsonl", elsewhere / "only_there.jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    own = lm_eval_task_yaml("facts", folder / "facts.jsonl")
    assert f'test: "{(folder / "facts.jsonl").resolve()}"' in own
    (folder / "facts.yaml").write_text(own)

    def variant(task: str, path: str) -> None:
        text = own.replace(f'"{(folder / "facts.jsonl").resolve()}"', f'"{path}"')
        (folder / f"{task}.yaml").write_text(text.replace("task: looplm_facts_local", f"task: looplm_{task}_local"))

    variant("moved", str(elsewhere / "facts.jsonl"))  # a copied folder: its YAML names the original's file
    variant("other", str(elsewhere / "only_there.jsonl"))
    variant("relative", "facts.jsonl")
    names = {f"looplm_{t}_local" for t in ("facts", "moved", "other", "relative")}
    manager = harness.task_manager([str(folder)], names=names)

    def data_files(task: str) -> str:
        return harness.located_spec(manager, f"looplm_{task}_local")["dataset_kwargs"]["data_files"]["test"]

    assert data_files("facts") == str((folder / "facts.jsonl").resolve())
    assert data_files("relative") == str(folder.resolve() / "facts.jsonl")
    assert capsys.readouterr().err == ""
    assert data_files("moved") == str(folder.resolve() / "facts.jsonl")
    assert capsys.readouterr().err == (
        f"note: lm-eval task 'looplm_moved_local' ({folder.resolve() / 'moved.yaml'}) reads "
        f"{folder.resolve() / 'facts.jsonl'}, the file of that name beside it, not {elsewhere / 'facts.jsonl'} "
        "(its folder was copied or moved)\n")
    assert data_files("other") == str(elsewhere / "only_there.jsonl")
    assert capsys.readouterr().err == (f"note: lm-eval task 'looplm_other_local' ({folder.resolve() / 'other.yaml'}) "
                                       f"reads {elsewhere / 'only_there.jsonl'}: an absolute path outside the task's "
                                       "folder, read as written\n")
    assert harness.located_spec(manager, "looplm_clutrr") == "looplm_clutrr"  # no local data files: by name
