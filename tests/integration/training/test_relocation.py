"""A run folder copied elsewhere reads only the copy, and a finished run extended with
``train.schedule_on_resume: continue_decay`` decays on instead of going back to the peak (issue 33
items 8 and 9): one demo-like folder (tokenizer, data, lm-eval tasks, a trained run in model/train,
as tools/pipeline.sh lays a demo out) is copied and the original renamed away; the copy's export,
lm-eval task loading and resume (extended from a decay-phase checkpoint) then work from the copy,
and the extended run's curves draw the lr of every step from the schedules its start events
recorded, equal to the lr each step logged."""

from __future__ import annotations

import json
import shutil

import pytest
from data_fixtures import data_assets
from train_fixtures import check_ok, records, reference_run, run_cli

from megatron_loop.optim.schedule import wsd_lambda, wsd_split

PEAK = 3e-3  # tiny_config's train.lr


def _demo_folder(root):
    """The demo's layout under ``root``: tokenizer/, data/train{,_valid}, corpus/eval (the bundled
    lm-eval tasks as tools/make_corpus.py writes them) and model/train (the reference run), its run
    config written by the trainer's own writer for these paths."""
    from megatron_loop.checkpoint.folders import save_run_config
    from megatron_loop.config import load_config

    assets, ref = data_assets(), reference_run()
    shutil.copytree(assets.tokenizer, root / "tokenizer")
    (root / "data").mkdir()
    for name in ("train", "train_valid"):
        for suffix in (".bin", ".idx"):
            shutil.copy(f"{assets.root / 'data' / name}{suffix}", root / "data" / f"{name}{suffix}")
    shutil.copytree(assets.corpus / "eval", root / "corpus" / "eval")
    run = root / "model" / "train"
    shutil.copytree(ref.run_dir, run)
    cfg = load_config(ref.config, _paths(root))
    save_run_config(run / "checkpoints", cfg)
    return run


def _paths(root) -> list[str]:
    return [f"train.output_dir={root / 'model' / 'train'}", f"data.tokenizer={root / 'tokenizer'}",
            f"data.train_prefixes=[{root / 'data' / 'train'}]"]


def test_a_copied_run_folder_reads_the_copy_and_an_extension_continues_the_decay(tmp_path, capsys):
    from megatron_loop.eval.harness import load_tasks, task_manager
    from megatron_loop.eval.tasks import resolve_tasks
    from megatron_loop.export.convert import convert_checkpoint
    from megatron_loop.curves import lr_schedule, plot_runs, read_run

    original, copy = tmp_path / "demo", tmp_path / "copy"
    _demo_folder(original)
    shutil.copytree(original, copy)
    original.rename(tmp_path / "gone")  # anything still reading the original now fails

    # export without --tokenizer: the run config's tokenizer, found relative to the copy
    convert_checkpoint(copy / "model" / "train" / "checkpoints", copy / "model" / "hf")
    assert (copy / "model" / "hf" / "tokenizer.json").read_text() == (copy / "tokenizer" / "tokenizer.json").read_text()
    # the copy's lm-eval task reads the copy's items (its YAML names the original's by absolute path, for plain
    # lm_eval run from anywhere): the file of that name beside the YAML, with one line saying so
    specs = resolve_tasks(["facts"])
    capsys.readouterr()
    tasks = load_tasks(specs, task_manager([str(copy / "corpus" / "eval")], names=["looplm_facts_local"]))
    items = [json.loads(line) for line in (copy / "corpus" / "eval" / "facts.jsonl").read_text().splitlines()]
    assert len(list(tasks["looplm_facts_local"].test_docs())) == len(items)
    assert f"reads {(copy / 'corpus' / 'eval' / 'facts.jsonl').resolve()}, the file of that name beside it" in \
        capsys.readouterr().err

    # resume the copy from step 9 (in its decay: split(10) = 0/8/2, update 9 ran at 0.55 x peak, the old
    # schedule's update 10 at 0.1 x peak), extended to 13 steps: the re-derived split 1/11/1 would run
    # update 10 at the peak; by default (continue_decay) the decay goes on from 0.55 x peak to 0.1 x peak at update 13
    run = copy / "model" / "train"
    result = run_cli("--config", str(reference_run().config), *[a for p in _paths(copy) for a in ("--set", p)],
                     "--set", "train.max_steps=13",
                     "--resume", str(run / "checkpoints" / "global_step9"))
    check_ok(result)
    assert ("\nresume: lr of update 10: 0.00131, continuing the decay to 0.1 x peak at update 13 "
            "(train.schedule_on_resume=rewarm re-warms)\n") in result.stderr
    assert "this run reads 32 more sequences (steps 10-13); the whole run reads 104 sequences = " in result.stderr
    assert "gone" not in result.stderr + result.stdout
    logged = {r["step"]: r["lr_muon"] for r in records(run, "train")}
    assert [logged[s] / PEAK for s in range(1, 10)] == pytest.approx([wsd_lambda(s, *wsd_split(10)) for s in range(1, 10)])
    assert [logged[s] / PEAK for s in range(10, 14)] == pytest.approx([0.55 - 0.45 * (s - 9) / 4 for s in range(10, 14)])

    # the curves: labelled by what the run is, the lr drawn at every step from the two recorded schedules
    curves = read_run(run)
    assert curves.label == "model (0+2x2+0)"  # the run folder (runs/NAME/train: NAME), layout, no conditioning
    assert [s["step"] for s in records(run, "start")] == [0, 9]
    drawn = lr_schedule(curves)
    assert [t for t, _ in drawn["muon"]] == list(range(1, 14))
    assert [lr for _, lr in drawn["muon"]] == pytest.approx([logged[s] for s in range(1, 14)], rel=1e-12)
    legend = [t.get_text() for t in plot_runs([curves]).axes[-1].get_legend().get_texts()]
    assert "model (0+2x2+0): learning rate at every step (Muon = AdamW)" in legend
