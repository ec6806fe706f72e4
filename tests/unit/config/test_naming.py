"""config/naming.py: what a run is called -- the wandb run name and the label of its curves follow
``train.output_dir`` unless the user named the run (issue 33 items 7, 9), and the conditioning in
the paper's notation is the registry's."""

from __future__ import annotations

from megatron_loop.config import config_from_dict, load_config
from megatron_loop.config.naming import conditioning_notation, run_folder_name, run_label, run_name
from testpaths import REPO


def test_run_name_follows_the_output_folder_unless_the_user_named_the_run(tmp_path):
    """The wandb run name and the figures' label (config/naming.py): a shipped config names its run
    after its file (examples/tiny_2x3_hist_lg.yaml: wandb_run_name tiny_2x3_hist_lg), so trained into another
    output_dir the run is named after that folder; a name set otherwise is kept."""
    shipped = REPO / "examples" / "tiny_2x3_hist_lg.yaml"
    assert run_name(load_config(shipped)) == "tiny_2x3_hist_lg"  # runs/tiny_2x3_hist_lg: the same name
    moved = load_config(shipped, [f"train.output_dir={tmp_path / 'runs' / 'lr_sweep_2' / 'train'}"])
    assert run_name(moved) == "lr_sweep_2"
    assert run_label(moved) == "lr_sweep_2 (0+2x3+0, H(channel, w=2)+LG)"
    named = load_config(shipped, [f"train.output_dir={tmp_path / 'x'}", "logging.wandb_run_name=my run"])
    assert run_name(named) == "my run"
    assert run_name(config_from_dict({"train": {"output_dir": str(tmp_path / "run")}})) == "run"  # no name: folder


def test_conditioning_in_the_papers_notation_and_the_pipelines_run_folders(tmp_path):
    from megatron_loop.registry.architectures import Conditioning

    assert conditioning_notation("channel", "channel", 2, "loop_gating") == "I(channel)+H(channel, w=2)+LG"
    assert conditioning_notation("scalar", init_noise=0.03) == "I(scalar, noise 0.03)"
    assert conditioning_notation() == "none"
    assert Conditioning("dense", "scalar", 4, "adaln").label == "I(dense)+H(scalar, w=4)+AdaLN"  # the registry's
    assert run_folder_name(tmp_path / "runs" / "demo" / "model" / "train" / "checkpoints" / "global_step6") == "model"
