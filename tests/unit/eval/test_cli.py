"""``eval/cli.py`` (``tools/eval_loops.py``): the settings checked before any model is loaded, each refusal
one ``error:`` line and exit 2, nothing written (the sweeps themselves: tests/integration/eval/)."""

from __future__ import annotations

import pytest

from megatron_loop.errors import LoopConfigError
from megatron_loop.eval.cli import _limit, default_output, main


def test_limit_is_items_or_a_fraction():
    assert _limit(None) is None
    assert _limit("200") == 200 and isinstance(_limit("200"), int)
    assert _limit("3.0") == 3
    assert _limit("0.25") == 0.25
    for bad in ("0", "-5", "2.5", "1e-9x", "nan"):
        with pytest.raises(LoopConfigError) as err:
            _limit(bad)
        assert str(err.value) == (f"--limit {bad}: expected a number of items per task (an integer >= 1) or a "
                                  "fraction of each task in (0, 1)")


def test_default_output_sits_next_to_the_model_folder(tmp_path):
    assert default_output(str(tmp_path / "runs" / "tiny" / "hf")) == tmp_path / "runs" / "tiny" / "hf_eval"
    assert default_output(str(tmp_path / "hf") + "/") == tmp_path / "hf_eval"


@pytest.mark.parametrize("args, message", [
    (["--tasks", ""], "error: --tasks '': expected task names (e.g. facts,clutrr=looplm_clutrr_local), 'none' for "
                      "the held-out loss only, or no --tasks for the paper's eleven"),
    (["--tasks", "none", "--valid-prefix", "PREFIX", "--exit-thresholds", "0.1"],
     "error: --exit-thresholds: expected --exit-criterion kl, cosine or q_exit with it"),
    (["--tasks", "none", "--valid-prefix", "PREFIX", "--loops", "1,2048"],
     "error: --loops 2048: expected loop counts of at most 1024, the export's largest num_loops (--no-loop-limit "
     "lifts only the 16 K limit)"),
    (["--tasks", "none", "--limit", "2.5"],
     "error: --limit 2.5: expected a number of items per task (an integer >= 1) or a fraction of each task in (0, 1)"),
])
def test_refused_before_the_model_is_read(tmp_path, capsys, args, message):
    data = tmp_path / "data"
    data.mkdir()
    for ext in (".bin", ".idx"):  # only their being files is checked this early
        (data / f"v{ext}").write_bytes(b"")
    args = [str(data / "v") if a == "PREFIX" else a for a in args]
    argv = ["--model", str(tmp_path / "no_export"), "--loops", "1", "--output", str(tmp_path / "out"), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [message]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # nothing written, not even the output folder
