"""``megatron_loop/cli.py``: the command-line convention every entry point shares (a project error or an
OS error such as a full disk is one ``error:`` line and exit 2, Ctrl-C one line and exit 130; anything
else is a traceback) and the argument checks the tools share."""

from __future__ import annotations

import json

import pytest

from megatron_loop.cli import check_output_folder, parse_loop_counts, read_tool_json, run_cli
from megatron_loop.errors import LoopConfigError, LoopDataError


def test_run_cli_turns_project_errors_into_one_line_and_exit_2(capsys):
    assert run_cli(lambda argv: 0 if argv == ["--ok"] else 7, ["--ok"]) == 0
    assert run_cli(lambda argv: 7, []) == 7
    for error in (LoopConfigError("train.lr=-1: expected a positive number"),
                  LoopDataError("data.bin: truncated")):
        def main(argv, error=error):
            raise error

        assert run_cli(main) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == f"error: {error}\n"

    def bug(argv):
        raise KeyError("a bug")

    with pytest.raises(KeyError, match="a bug"):  # not ours to word: the traceback stays
        run_cli(bug)



@pytest.mark.parametrize("error, line", [
    # a full disk while writing a file: the file and the condition
    (OSError(28, "No space left on device", "/data/run/eval/results.json"),
     "error: /data/run/eval/results.json: no space left on device (ENOSPC)"),
    # an atomic write's temporary file: the file it stood for (the temporary one is gone)
    (OSError(28, "No space left on device", "/data/run/eval/.results.json.tmp-4242-a1b2c3.json"),
     "error: /data/run/eval/results.json: no space left on device (ENOSPC)"),
    # preprocessing's temporary prefix files
    (OSError(27, "File too large", "/data/corpus.tmp4242_valid.bin"),
     "error: /data/corpus_valid.bin: file too large (the process file-size limit, ulimit -f) (EFBIG)"),
    # a rename onto a folder (`latest` made a folder): the target, not the vanished temporary file
    (IsADirectoryError(21, "Is a directory", "/ckpt/.latest.tmp-4242-a1b2c3", None, "/ckpt/latest"),
     "error: /ckpt/latest: Is a directory (EISDIR)"),
    (PermissionError(1, "Operation not permitted", "/ckpt/global_step5.partial"),
     "error: /ckpt/global_step5.partial: operation not permitted (EPERM)"),
    (OSError(30, "Read-only file system", "/ro/out"), "error: /ro/out: read-only file system (EROFS)"),
    # a write probe names the folder it tested
    (OSError(30, "Read-only file system", "/run/checkpoints/.write_probe.4242"),
     "error: /run/checkpoints: read-only file system (EROFS)"),
    # shared memory is named as such: not the output folder's disk
    (OSError(28, "No space left on device", "/dev/shm/torch_4242_1"),
     "error: /dev/shm/torch_4242_1: no space left on device (ENOSPC) in shared memory (/dev/shm); give the job "
     "more shared memory"),
    (OSError(28, "No space left on device"), "error: no space left on device (ENOSPC)"),
])
def test_run_cli_turns_an_os_error_into_one_line_naming_the_real_file(capsys, error, line):
    def main(argv):
        raise error

    assert run_cli(main) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == line + "\n"


def test_run_cli_turns_ctrl_c_into_one_line_and_exit_130(capsys):
    def main(argv):
        raise KeyboardInterrupt

    assert run_cli(main) == 130
    assert capsys.readouterr().err == ("error: interrupted (SIGINT): stopped; outputs are published only when "
                                       "complete, so nothing half-written is left\n")

def test_check_output_folder_refuses_a_file_in_the_way(tmp_path):
    check_output_folder(tmp_path / "new" / "deeper", "--output", "the results")  # creatable: fine
    check_output_folder(tmp_path, "--output", "the results")  # an existing folder: fine
    file = tmp_path / "results.json"
    file.write_text("{}")
    with pytest.raises(LoopConfigError, match=rf"^--output {file}: exists and is not a folder; expected a folder "
                                              r"for the results$"):
        check_output_folder(file, "--output", "the results")
    with pytest.raises(LoopConfigError, match=rf"^--output-prefix {file}/run/out: {file} is a file; expected a "
                                              r"folder for the figures$"):
        check_output_folder(file / "run", "--output-prefix", "the figures", given=file / "run" / "out")


@pytest.mark.parametrize("text, loops", [("1,2,4,8", [1, 2, 4, 8]), ("3", [3]), (" 1, 2,", [1, 2])])
def test_loop_counts_parse(text, loops):
    assert parse_loop_counts(text) == loops


@pytest.mark.parametrize("text, message", [
    ("1,two", r"--loops '1,two': expected comma-separated integers, e.g. 1,2,4,8"),
    ("0,1", r"--loops '0,1': expected loop counts r >= 1"),
    ("", r"--loops '': expected loop counts r >= 1"),
    ("1,2,2", r"--loops '1,2,2': r=2 listed twice; expected distinct loop counts"),
    ("4,2,8", r"--loops '4,2,8': expected loop counts in increasing order, e.g. 2,4,8"),
])
def test_bad_loop_counts_are_one_error(text, message):
    with pytest.raises(LoopConfigError, match="^" + message):
        parse_loop_counts(text)


def test_read_tool_json_reads_a_file_or_its_folder_and_names_what_is_wrong(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"loops": [1, 2], "tasks": {}}))
    assert read_tool_json(path, "--results", "results.json", "tools/eval_loops.py", ["loops"])["loops"] == [1, 2]
    assert read_tool_json(tmp_path, "--results", "results.json", "tools/eval_loops.py", ["loops", "tasks"]) == {
        "loops": [1, 2], "tasks": {}}
    cases = [
        (tmp_path / "none.json", None, r"none.json: not found; expected a results.json written by tools/eval_loops.py"),
        (tmp_path / "bad.json", "{oops", r"bad.json: not readable JSON \(Expecting property name"),
        (tmp_path / "list.json", "[1]", r"list.json: missing \['a JSON object'\]"),
        (tmp_path / "partial.json", '{"tasks": {}}', r"partial.json: missing \['loops'\]; expected a results.json"),
    ]
    for file, text, message in cases:
        if text is not None:
            file.write_text(text)
        with pytest.raises(LoopDataError, match=r"^--results .*" + message):
            read_tool_json(file, "--results", "results.json", "tools/eval_loops.py", ["loops"])


def test_the_same_error_of_several_ranks_of_a_launch_is_printed_once(tmp_path):
    """Under a launcher (``WORLD_SIZE`` > 1, the ranks children of one launcher process: here this
    test) the ranks that reach the same error print its line once; another message is printed too."""
    import os
    import subprocess
    import sys

    from testpaths import REPO

    code = "import sys\nfrom megatron_loop.cli import print_error\nprint_error(sys.argv[1])"
    same, other = f"{tmp_path}: the same failure", f"{tmp_path}: another failure"
    env = dict(os.environ, WORLD_SIZE="2")
    printed = [subprocess.run([sys.executable, "-c", code, message], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=60).stderr for message in (same, same, other)]
    assert printed == [f"error: {same}\n", "", f"error: {other}\n"]
    alone = subprocess.run([sys.executable, "-c", code, same], env=dict(os.environ, WORLD_SIZE="1"), cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert alone.stderr == f"error: {same}\n"  # a world of one always prints
