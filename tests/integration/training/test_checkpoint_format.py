"""The on-disk checkpoint format (:mod:`megatron_loop.checkpoint`), in process: the manifest catches
missing and corrupt files, which checkpoint a resume or an export reads (``latest`` decides,
corrupt ones fall back, a damaged pointer is one error or a fallback), publishing a step again
replaces it whole, and the universal conversion carries Muon's momentum. The CLI cases (a save
killed before publishing, a truncated shard at resume) are in tests/integration/reliability/test_checkpoints.py."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from megatron_loop.checkpoint.folders import LATEST, PARTIAL, read_latest
from megatron_loop.checkpoint.manifest import verify_checkpoint
from megatron_loop.checkpoint.publish import publish, remove_partials
from megatron_loop.checkpoint.selection import select_automatic, select_checkpoint, select_explicit
from megatron_loop.errors import LoopDataError
from train_fixtures import copy_run, reference_run

pytestmark = [pytest.mark.deps, pytest.mark.slow]  # in the dependency drift check (tools/deps.py drift)


def _garble(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different bytes
    path.write_bytes(bytes(data))


def _ckpt(tmp_path):
    return copy_run(reference_run().run_dir, tmp_path / "run") / "checkpoints"


# ----------------------------------------------------------------------------- manifest


def test_manifest_detects_missing_and_corrupt_files(tmp_path):
    tag = shutil.copytree(reference_run().run_dir / "checkpoints" / "global_step9", tmp_path / "global_step9")
    manifest = json.loads((tag / "manifest.json").read_text())
    assert verify_checkpoint(tag)["step"] == 9
    rng = tag / "rng_state_rank0.pt"
    _garble(rng)
    with pytest.raises(LoopDataError, match=r"rng_state_rank0\.pt: sha256 differs .*corrupt"):
        verify_checkpoint(tag)
    rng.unlink()
    with pytest.raises(LoopDataError, match=r"rng_state_rank0\.pt: missing; the manifest lists it"):
        verify_checkpoint(tag)
    (tag / "manifest.json").unlink()
    with pytest.raises(LoopDataError, match=r"manifest\.json: missing; the checkpoint is incomplete"):
        verify_checkpoint(tag)
    assert manifest["files"]


# ----------------------------------------------------------------------------- which checkpoint


def test_automatic_resume_follows_latest_not_the_highest_step(tmp_path):
    ckpt = _ckpt(tmp_path)
    (ckpt / "latest").write_text("global_step9")  # a rollback to 9; 10 is the abandoned branch
    chosen = select_automatic(ckpt)
    assert (chosen.tag, chosen.newer) == ("global_step9", ("global_step10",))
    (ckpt / "latest").write_text("global_step10")
    _garble(next((ckpt / "global_step10").glob("*optim_states.pt")))
    chosen = select_automatic(ckpt)  # latest corrupt: the newest complete one before it
    assert chosen.tag == "global_step9" and "sha256 differs" in chosen.notes[0]
    with pytest.raises(LoopDataError, match=r"global_step10/zero_pp_rank_0_mp_rank_00_optim_states\.pt: "
                                            r"sha256 differs .*corrupt"):
        select_checkpoint(ckpt / "global_step10")  # named explicitly: refused, no fallback


@pytest.mark.timeout(300)
def test_latest_holding_bytes_that_are_not_a_tag_is_one_error_or_a_fallback(tmp_path):
    ckpt = _ckpt(tmp_path)
    (ckpt / "latest").write_bytes(b"\xff\xfe\x00garbage\x80")
    chosen = select_automatic(ckpt)  # automatic: the newest complete checkpoint, with the reason
    assert chosen.tag == "global_step10"
    assert chosen.notes == (f"skipping checkpoint latest: {ckpt / 'latest'}: not a text file (11 bytes, not a tag); "
                            "expected the tag of a checkpoint such as global_step30",)
    with pytest.raises(LoopDataError, match=r"latest: not a text file \(11 bytes, not a tag\)"):
        select_explicit(ckpt)  # --resume of the folder: refused with one line


# ----------------------------------------------------------------------------- publishing


def test_publishing_a_step_again_replaces_it_whole_and_moves_latest_last(tmp_path):
    """A step saved again (after resuming from an earlier checkpoint) replaces the published folder
    of that tag: the old one is swapped out under a ``.partial`` name and removed, ``latest`` is
    written after the rename."""
    root = tmp_path / "checkpoints"
    (root / "global_step5").mkdir(parents=True)
    (root / "global_step5" / "old").write_text("old")
    (root / LATEST).write_text("global_step4")
    partial = root / ("global_step5" + PARTIAL)
    partial.mkdir()
    (partial / "new").write_text("new")
    publish(root, partial, "global_step5")
    assert sorted(p.name for p in root.iterdir()) == ["global_step5", LATEST]
    assert [p.name for p in (root / "global_step5").iterdir()] == ["new"]
    assert read_latest(root) == "global_step5"
    (root / ("global_step6" + PARTIAL)).mkdir()  # a save that crashed before publishing
    remove_partials(root)
    assert sorted(p.name for p in root.iterdir()) == ["global_step5", LATEST]


# ----------------------------------------------------------------------------- universal layout


def test_universal_conversion_carries_muon_momentum(tmp_path):
    from deepspeed.checkpoint import PARAM

    from megatron_loop.checkpoint.universal import to_universal
    from megatron_loop.checkpoint.weights import safe_load

    tag = reference_run().run_dir / "checkpoints" / "global_step9"
    out = to_universal(tag, tmp_path / "uni")
    optim = safe_load(next(tag.glob("*optim_states.pt")))["optimizer_state_dict"]
    keys = {k for s in optim["base_optimizer_state"]["state"].values() for k in s}
    assert keys == {"momentum_buffer", "exp_avg", "exp_avg_sq", "step"}  # Muon and AdamW groups
    for group, mapping in enumerate(optim["param_slice_mappings"]):
        state = optim["base_optimizer_state"]["state"][group]
        for name, frag in mapping.items():
            for key in ("fp32", *(k for k in state if k != "step")):
                flat = optim["single_partition_of_fp32_groups"][group] if key == "fp32" else state[key]
                saved = torch.load(out / "zero" / name / f"{key}.pt", weights_only=False)[PARAM]
                assert torch.equal(saved.flatten(), flat.narrow(0, frag.start, frag.numel)), (name, key)
    muon = optim["param_slice_mappings"][0]
    assert all((out / "zero" / name / "momentum_buffer.pt").is_file() for name in muon)
