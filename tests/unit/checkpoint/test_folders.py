"""checkpoint/folders.py: the run config next to the checkpoints records its paths absolute and, for
those inside the run's folder, relative to itself, so a copied or moved run folder reads its own
tokenizer and data; paths outside the folder are read as recorded and named in one line (issue 33
item 8)."""

from __future__ import annotations

import json
import shutil

from megatron_loop.checkpoint.folders import CONFIG_NAME, load_run_config, run_folder, save_run_config
from megatron_loop.config import config_from_dict


def _demo(root, shared):
    """runs/demo as tools/pipeline.sh lays it out, its training data in a folder outside it."""
    (root / "tokenizer").mkdir(parents=True)
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    (root / "data").mkdir()
    shared.mkdir()
    for prefix in (root / "data" / "corpus_valid", shared / "corpus"):
        for suffix in (".bin", ".idx"):
            prefix.with_suffix(suffix).write_bytes(b"x")
    cfg = config_from_dict({"train": {"output_dir": str(root / "model" / "train")},
                            "data": {"train_prefixes": [str(shared / "corpus")],
                                     "valid_prefixes": [str(root / "data" / "corpus_valid")],
                                     "tokenizer": str(root / "tokenizer")}})
    ckpt = root / "model" / "train" / "checkpoints"
    ckpt.mkdir(parents=True)
    save_run_config(ckpt, cfg)
    return ckpt


def test_a_copied_run_folder_reads_its_own_files_and_names_the_ones_outside(tmp_path, capsys):
    demo, shared = tmp_path / "runs" / "demo", tmp_path / "shared"
    ckpt = _demo(demo, shared)
    assert run_folder(demo / "model" / "train") == demo
    raw = json.loads((ckpt / CONFIG_NAME).read_text())
    assert raw["data"]["tokenizer"] == str(demo / "tokenizer")  # absolute, for whoever reads the JSON
    assert raw["relocation"] == {"written_in": str(ckpt), "relative": {
        "data.tokenizer": {"absolute": str(demo / "tokenizer"), "relative": "../../../tokenizer"},
        "data.valid_prefixes[0]": {"absolute": str(demo / "data" / "corpus_valid"),
                                   "relative": "../../../data/corpus_valid"},
        "train.output_dir": {"absolute": str(demo / "model" / "train"), "relative": ".."}}}
    assert load_run_config(ckpt).data.tokenizer == str(demo / "tokenizer")  # in place: as recorded, silently
    assert capsys.readouterr().err == ""

    copy = tmp_path / "elsewhere" / "demo"
    shutil.copytree(demo, copy)
    demo.rename(tmp_path / "gone")
    cfg = load_run_config(copy / "model" / "train" / "checkpoints")
    assert cfg.data.tokenizer == str(copy / "tokenizer")
    assert cfg.data.valid_prefixes == [str(copy / "data" / "corpus_valid")]
    assert cfg.train.output_dir == str(copy / "model" / "train")
    assert cfg.data.train_prefixes == [str(shared / "corpus")]  # outside the folder: as recorded, and said
    assert capsys.readouterr().err == (
        f"note: {copy / 'model' / 'train' / 'checkpoints' / CONFIG_NAME}: written in {ckpt}, read from "
        f"{copy / 'model' / 'train' / 'checkpoints'}; outside this run folder, read as recorded: "
        f"data.train_prefixes[0]={shared / 'corpus'}\n")

    # a path edited by hand after training is taken as edited
    path = copy / "model" / "train" / "checkpoints" / CONFIG_NAME
    raw = json.loads(path.read_text())
    raw["data"]["tokenizer"] = str(tmp_path / "other_tokenizer")
    path.write_text(json.dumps(raw))
    assert load_run_config(path.parent).data.tokenizer == str(tmp_path / "other_tokenizer")
