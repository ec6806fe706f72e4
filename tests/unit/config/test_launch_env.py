"""``config/launch_env.py``: the variables a launcher sets, read in one place. A value that is not a plain
decimal integer in its range, a rank outside its world, or a rank without the rest of its launcher's
variables is one ``LoopConfigError`` naming the variable (before: ``int()``'s traceback at WORLD_SIZE=abc)."""

from __future__ import annotations

import pytest

from megatron_loop.config.launch_env import check_launch_env, env_int, launch_world_size
from megatron_loop.errors import LoopConfigError


@pytest.mark.parametrize("raw", ["abc", "", " ", "1_0", "٣", "1.0", "0x10", "-1"])
def test_a_value_that_is_not_a_plain_integer_names_the_variable(raw):
    with pytest.raises(LoopConfigError, match=rf"^environment variable WORLD_SIZE={raw!r}: expected an integer >= 1 "
                                              r"\(the number of ranks the launcher started\)$"):
        env_int("WORLD_SIZE", environ={"WORLD_SIZE": raw})


def test_values_in_range():
    assert env_int("WORLD_SIZE", environ={"WORLD_SIZE": " 8 "}) == 8
    assert env_int("RANK", 5, environ={}) == 5  # unset: the default
    assert env_int("MASTER_PORT", environ={"MASTER_PORT": "65535"}) == 65535
    with pytest.raises(LoopConfigError, match=r"MASTER_PORT='65536': expected an integer in \[1, 65535\]"):
        env_int("MASTER_PORT", environ={"MASTER_PORT": "65536"})


def test_the_world_a_launcher_started():
    assert launch_world_size({}) == 1  # plain python
    assert launch_world_size({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}) == 4  # a bare srun
    assert launch_world_size({"WORLD_SIZE": "2", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"}) == 2  # torchrun in srun


@pytest.mark.parametrize("environ,message", [
    ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
     r"^environment variable RANK=2: expected a rank below WORLD_SIZE=2 \(ranks count from 0\)$"),
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "5"}, r"SLURM_LOCALID=5: expected a rank below "
                                                                       r"SLURM_NTASKS=2"),
    ({"RANK": "0", "WORLD_SIZE": "1"}, r"^environment variable RANK=0 without MASTER_ADDR, MASTER_PORT: expected "
                                       r"WORLD_SIZE, MASTER_ADDR and MASTER_PORT with it"),
    ({"SLURM_NTASKS": "2"}, r"^environment variable SLURM_NTASKS=2 without SLURM_PROCID: expected both"),
])
def test_ranks_inside_their_world_and_with_their_launcher(environ, message):
    with pytest.raises(LoopConfigError, match=message):
        check_launch_env(environ)


def test_a_complete_launch_passes():
    check_launch_env({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0"})
