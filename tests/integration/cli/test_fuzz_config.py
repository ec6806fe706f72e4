"""Bad inputs closed as a class (issue 43): every config key, whole config files and the launch environment,
fuzzed (hypothesis), through ``pretrain_loop.py`` in this process (``--dry-run``, ``--print-config`` and the
training path up to its process group: ``fuzz_fixtures.WORK``).

* every key of every section with values of every kind (wrong types, numbers at and past every edge, NaN
  and infinities, empty, nested garbage): accepted, or one ``error:`` line and exit 2; a value that cannot
  be of the key's type under any reading (a list for a number, a boolean for a string, NaN for a float,
  null for a key that is not optional: ``fuzz_strategies.wrong_kind``) is refused naming the key;
* whole YAML documents of nested garbage as the config file;
* the variables a launcher sets (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_PORT, SLURM_*, ...) with garbage: a
  value that is not an integer is refused naming a variable.

``LOOPLM_FUZZ_EXAMPLES=N`` runs N random examples per property (tests/support/fuzz_fixtures.py).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_fixtures import check, fuzz_assets, fuzz_settings, run_entry
from fuzz_strategies import NESTED, TEXT, config_keys, launch_values, wrong_kind, yaml_text
from megatron_loop.config.launch_env import LAUNCH_VARIABLES

MODES = [["--dry-run"], ["--print-config"], [], ["--dry-run", "--skip-data-check"]]


@pytest.fixture(scope="module")
def assets():
    return fuzz_assets()


def test_every_config_key_with_values_of_every_kind(assets):
    @fuzz_settings(60)
    @given(key=st.sampled_from(config_keys()), value=NESTED, mode=st.sampled_from(MODES))
    def fuzzed(key, value, mode):
        section, name, annotation = key
        override = f"{section}.{name}={yaml_text(value)}"
        outcome = run_entry("pretrain_loop.py", ["--config", str(assets.config), "--set", override, *mode],
                            watch=assets.folders())
        check(outcome)
        if wrong_kind(value, annotation):
            assert outcome.code == 2 and f"{section}.{name}" in outcome.errors[0], (override, outcome.describe())

    fuzzed()


def test_whole_config_files_of_garbage(assets, tmp_path_factory):
    folder = tmp_path_factory.mktemp("configs")
    sections = st.sampled_from(["model", "train", "data", "logging", "parallel", "modle", "1", ""])
    documents = st.one_of(NESTED, st.dictionaries(sections, NESTED, max_size=4),
                          st.dictionaries(sections, st.dictionaries(TEXT, NESTED, max_size=3), max_size=3))

    @fuzz_settings(25)
    @given(document=st.one_of(documents.map(yaml_text), TEXT), mode=st.sampled_from(MODES[:2]))
    def fuzzed(document, mode):
        path = folder / "fuzzed.yaml"
        path.write_text(document, encoding="utf-8", errors="surrogateescape")
        check(run_entry("pretrain_loop.py", ["--config", str(path), *mode], watch=assets.folders()))

    fuzzed()


def test_launch_environment_variables(assets):
    @fuzz_settings(30)
    @given(env=st.dictionaries(st.sampled_from(sorted(LAUNCH_VARIABLES)), launch_values(), min_size=1, max_size=4),
           mode=st.sampled_from([["--dry-run"], []]))
    def fuzzed(env, mode):
        outcome = run_entry("pretrain_loop.py", ["--config", str(assets.config), *mode], env=env,
                            watch=assets.folders())
        check(outcome)
        not_integers = [k for k, v in env.items() if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", v)]
        if not_integers:
            assert outcome.code == 2 and any(f"environment variable {k}=" in outcome.errors[0]
                                             for k in env), (env, outcome.describe())

    fuzzed()
