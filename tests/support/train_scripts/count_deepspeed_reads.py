"""``pretrain_loop.py`` that counts how often one start reads and resolves its DeepSpeed JSON.

    python tests/support/train_scripts/count_deepspeed_reads.py OUT.json [pretrain_loop.py arguments]

Writes ``OUT.json``: the times the file of ``train.deepspeed_config`` was opened (any reader, through
``open``), the calls of the run's reader (``read_run_json``), of the resolution (``resolve_ds_config``),
of the shipped-stage reader (``read_ds_config``), and whether ``build_engine`` was given the very
settings object the start made (``DeepSpeedSettings.of_run``).
"""

from __future__ import annotations

import builtins
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/support
from testpaths import REPO  # noqa: E402

sys.path.insert(0, str(REPO))


def main() -> int:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    from megatron_loop.config import deepspeed as D
    from megatron_loop.training import setup

    counts = {"opened": 0, "read_run_json": 0, "resolve_ds_config": 0, "read_ds_config": 0}
    made, given = [], []

    def counted(name, function):
        def call(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)
        return call

    for name in ("read_run_json", "resolve_ds_config", "read_ds_config"):
        setattr(D, name, counted(name, getattr(D, name)))
    of_run = D.DeepSpeedSettings.of_run.__func__

    def recording_of_run(cls, *args, **kwargs):
        settings = of_run(cls, *args, **kwargs)
        made.append(settings)
        return settings

    D.DeepSpeedSettings.of_run = classmethod(recording_of_run)
    build_engine = setup.build_engine

    def recording_build_engine(model, settings, deepspeed_settings, **kwargs):
        given.append(deepspeed_settings)
        return build_engine(model, settings, deepspeed_settings, **kwargs)

    setup.build_engine = recording_build_engine
    opened, real_open = [], builtins.open

    def counting_open(file, *args, **kwargs):
        opened.append(os.fspath(file) if isinstance(file, (str, os.PathLike)) else None)
        return real_open(file, *args, **kwargs)

    builtins.open = counting_open
    import pretrain_loop
    from megatron_loop.config import load_config

    try:
        return pretrain_loop.main(argv)
    finally:
        builtins.open = real_open
        config = argv[argv.index("--config") + 1]
        path = load_config(config).train.deepspeed_config
        counts["opened"] = sum(1 for f in opened if f is not None and os.path.realpath(f) == os.path.realpath(path))
        counts["engine_given_the_start_settings"] = len(made) == 1 and len(given) == 1 and given[0] is made[0]
        out.write_text(json.dumps(counts))


if __name__ == "__main__":
    sys.exit(main())
