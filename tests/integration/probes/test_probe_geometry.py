"""tools/probe_geometry.py: JSON + figures on a tiny indexed prefix, comparison against a
reference report, and the one-line ``error:`` contract (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from probe_fixtures import conditioned_model, tiny_model, write_prefix

from megatron_loop.cli import run_cli
from megatron_loop.probes import cli
from testpaths import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def args(prefix: str, out: Path, *extra: str, source: tuple[str, str] = ("--checkpoint", "unused")) -> list[str]:
    return [*source, "--valid-prefix", prefix, "--loops", "2,5", "--num-sequences", "3",
            "--num-positions", "30", "--seq-length", "13", "--output", str(out), "--no-progress", *extra]


def test_sample_defaults_come_from_the_run_and_the_data(tmp_path, capsys):
    """Without --seq-length / --num-sequences: the export's training length and the paper's 49 sequences, or
    every window the validation data holds when fewer (a tiny run's first probe works as it is)."""
    from megatron_loop.export.convert import export_state_dict
    from megatron_loop.probes.sampling import packed_windows

    prefix = write_prefix(tmp_path)
    model = tiny_model()
    export_state_dict(model.state_dict(), model.config, tmp_path / "hf", train_seq_length=13)
    windows = packed_windows(prefix, 13)
    assert 1 < windows < 49
    assert run_cli(cli.main, ["--model", str(tmp_path / "hf"), "--valid-prefix", prefix, "--loops", "2",
                              "--output", str(tmp_path / "p"), "--no-progress"]) == 0
    sampling = json.loads((tmp_path / "p" / "geometry.json").read_text())["sampling"]
    assert (sampling["seq_length"], sampling["num_sequences"]) == (13, windows)
    assert sampling["num_positions"] == windows * 12  # every position ('paper' when the sample holds fewer)
    err = capsys.readouterr().err
    assert (f"note: --num-sequences: {prefix} packs into {windows} windows of 13 tokens, fewer than the paper's 49 "
            "(App. C.4); using all of them") in err


def test_cli_on_hf_export_writes_json_and_plots(tmp_path, capsys):
    from megatron_loop.export.convert import export_state_dict

    prefix = write_prefix(tmp_path)
    model = tiny_model(prelude=1, coda=1)
    export_state_dict(model.state_dict(), model.config, tmp_path / "hf")
    assert run_cli(cli.main, args(prefix, tmp_path / "a", source=("--model", str(tmp_path / "hf")))) == 0
    report = json.loads((tmp_path / "a" / "geometry.json").read_text())
    assert sorted(report["loops"], key=int) == ["2", "3", "5"]  # L_tr = 3 added as the V~ reference
    assert report["reference_loops_added"] == [3] and report["loops"]["3"]["interaction"] is None
    assert report["sampling"]["num_positions"] == 30 and report["sampling"]["num_sequences"] == 3
    r5 = report["loops"]["5"]
    assert len(r5["block"]["angle"]) == r5["effective_depth"] == 12
    assert len(r5["loop"]["relative_update"]) == 5 and len(r5["loop"]["normalized_state_variance"]) == 6
    assert r5["amplification"]["telescoping"]["product"] == pytest.approx(
        r5["amplification"]["telescoping"]["variance_ratio"], rel=1e-10)
    assert r5["interaction"]["by_lag"]["pairs"] == [2, 4]
    assert report["lag_sets"] == ["1-1"] and "1-1" in r5["interaction"]["by_lag"]["summaries"]
    for name in ("geometry_trajectory.png", "geometry_interaction.png"):
        assert name in report["files"]
        assert (tmp_path / "a" / name).read_bytes()[:8] == PNG_MAGIC
    out, err = capsys.readouterr()
    assert "wrote" in out
    # loop gating on the rescaled grid: each L has its own trajectory, so one pass per L, and it says so
    assert "loop sweep: one pass per r for r = 2, 3, 5 (timestep conditioning (loop_gating) on the rescaled grid" in err
    assert report["sweep_passes"]["mode"] == "per-r"

    # the export probed again on the same sample, compared with the first report: ratio 1, 0 %
    again = args(prefix, tmp_path / "b", "--loops", "5", "--interaction-sources", "beyond_training",
                 "--reference-json", str(tmp_path / "a" / "geometry.json"), source=("--model", str(tmp_path / "hf")))
    assert run_cli(cli.main, again) == 0
    comparison = json.loads((tmp_path / "b" / "geometry.json").read_text())["comparison"]["5"]
    assert comparison["ratio_by_lag"]["C"]["ratio"] == pytest.approx([1.0, 1.0])
    assert comparison["percent_difference"]["1-1"]["C"] == pytest.approx(0.0, abs=1e-9)

    # another sample against that reference: refused before the model is loaded, naming the settings
    other = args(prefix, tmp_path / "c", "--seq-length", "14", "--reference-json", str(tmp_path / "a"),
                 source=("--model", str(tmp_path / "hf")))
    capsys.readouterr()
    assert run_cli(cli.main, other) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --reference-json {tmp_path / 'a'}: its probe sample differs from this one (--seq-length 13 there, "
        "14 here); expected the same sample (App. C.4 compares identical examples "
        "and masks)"]
    assert not (tmp_path / "c").exists()


def test_cli_one_pass_sweep_equals_per_r(tmp_path, monkeypatch, capsys):
    """No timestep conditioning: every L from the forwards at L_max, said on stderr and recorded; --per-r
    gives the same geometry.json, bitwise, from one pass per L."""
    prefix = write_prefix(tmp_path)
    monkeypatch.setattr(cli, "check_source", lambda checkpoint, hf_dir: None)
    monkeypatch.setattr(cli, "load_model", lambda checkpoint, hf_dir: conditioned_model(initial_injection="scalar"))
    reports, lines = [], []
    for name, extra in (("one", []), ("per_r", ["--per-r"])):
        assert run_cli(cli.main, args(prefix, tmp_path / name, *extra)) == 0
        lines.append(capsys.readouterr().err.strip().splitlines()[-1])
        reports.append(json.loads((tmp_path / name / "geometry.json").read_text()))
    assert lines == ["loop sweep: one forward per batch at r = 5 reads out r = 2, 3, 5 (the trajectory does not "
                     "depend on r: no timestep conditioning)", "loop sweep: one pass per r for r = 2, 3, 5 (--per-r)"]
    assert [r.pop("sweep_passes")["mode"] for r in reports] == ["one-pass", "per-r"]
    assert reports[0]["loops"] == reports[1]["loops"]


@pytest.mark.parametrize("extra,needle", [
    (["--num-positions", "999"], "--num-positions 999"),
    (["--num-positions", "100000"], "--num-positions 100000: 3 sequences of 12 predictions hold 36; expected 1..36, "
                                    "'all' or 'paper' (the paper's 100000, App. C.4, needs e.g. 49 sequences of 2048 tokens)"),
    (["--loops", "2,x"], "--loops"),
    (["--loops", "5,2"], "--loops '5,2': expected loop counts in increasing order, e.g. 2,5"),
    (["--loops", "2,2,5"], "--loops '2,2,5': r=2 listed twice; expected distinct loop counts"),
    (["--lag-sets", "3-1"], "lag set"),
])
def test_cli_errors_are_one_line(tmp_path, monkeypatch, capsys, extra, needle):
    prefix = write_prefix(tmp_path)
    monkeypatch.setattr(cli, "check_source", lambda checkpoint, hf_dir: None)
    monkeypatch.setattr(cli, "load_model", lambda checkpoint, hf_dir: tiny_model())
    assert run_cli(cli.main, args(prefix, tmp_path / "o") + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0]


def test_tool_missing_checkpoint_exits_2(tmp_path):
    prefix = write_prefix(tmp_path)
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "probe_geometry.py"), "--checkpoint",
                           str(tmp_path / "missing"), "--valid-prefix", prefix, "--seq-length", "13",
                           "--num-sequences", "3", "--output", str(tmp_path / "o")],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'missing'}: checkpoint folder not found"]
