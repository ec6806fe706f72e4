"""megatron_loop/console.py: the third-party false alarms are dropped from the libraries' own loggers (every
other line of theirs passes), and a progress bar is drawn only on a terminal."""

from __future__ import annotations

import io
import logging
import os

import pytest

import megatron_loop  # noqa: F401  (installs the filters, as every entry point does)
from megatron_loop.console import FILTERED, quiet_third_party, show_progress


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.mark.deps
def test_deepspeed_and_transformers_false_alarms_are_dropped_and_nothing_else():
    from deepspeed.utils import logger as deepspeed_logger  # DeepSpeed's own logger, the one its engine uses

    quiet_third_party()  # a second call adds no second filter
    assert sum(type(f).__name__ == "DropMessages" for f in deepspeed_logger.filters) == 1
    transformers_logger = logging.getLogger("transformers.configuration_utils")
    for logger, dropped in ((deepspeed_logger, ["Setting accelerator to CPU. If you have GPU or other accelerator, "
                                                "we were unable to detect it.",
                                                "**** You are using ZeRO with an untested optimizer, proceed with "
                                                "caution *****"]),
                            (transformers_logger, ["You are using a model of type `looplm` to instantiate a model of "
                                                   "type ``. This may be expected ..."])):
        sink = _Collect()
        logger.addHandler(sink)
        try:
            for line in dropped:
                logger.warning(line)
            logger.warning("a warning the user must see")
        finally:
            logger.removeHandler(sink)
        assert sink.lines == ["a warning the user must see"]
    length = logging.getLogger("transformers.tokenization_utils_base")
    sink = _Collect()
    length.addHandler(sink)
    try:
        length.warning("Token indices sequence length is longer than the specified maximum sequence length for this "
                       "model (1201 > 128). Running this sequence through the model will result in indexing errors")
    finally:
        length.removeHandler(sink)
    assert sink.lines == []
    assert set(FILTERED) == {"DeepSpeed", "transformers.configuration_utils", "transformers.tokenization_utils_base"}


def test_progress_only_on_a_terminal():
    assert not show_progress(True, io.StringIO())  # a log file or a pipe: no bar
    leader, follower = os.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as tty:
            assert show_progress(True, tty)
            assert not show_progress(False, tty)  # switched off
    finally:
        os.close(leader)
        os.close(follower)
