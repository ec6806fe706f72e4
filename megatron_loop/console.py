"""What reaches the console besides the project's own lines: third-party lines that are not the
user's business are filtered by message (in every process that imports the package, before
DeepSpeed or transformers log anything), and progress bars are drawn only on a terminal.

Filtered, each a known false alarm or a notice about a choice the project made on purpose:

* DeepSpeed's ``Setting accelerator to CPU`` (every process of a CPU-only run says it) and its
  ``You are using ZeRO with an untested optimizer`` (Muon + AdamW is ours, tested by the suite);
* transformers' ``You are using a model of type `looplm` to instantiate a model of type ``
  (``AutoTokenizer`` reads a LoopLM export's config.json without its remote code, only to find
  the tokenizer class, which tokenizer_config.json names);
* transformers' ``Token indices sequence length is longer than the specified maximum sequence
  length`` (exports before issue 43 capped ``model_max_length`` at the training length; the
  model's positions go further, and lm-eval cuts what it feeds the model to them).

A progress bar written to a file or a pipe is a line of ``\\r``-separated redraws in the log, so
:func:`show_progress` says no when stderr is not a terminal, whatever the settings ask, and every
entry point (``cli.run_cli``) turns off, through :func:`quiet_progress`, the bars the libraries
draw on their own (transformers' shard loading and writing, lm-eval's, datasets') in that case.
"""

from __future__ import annotations

import logging
import os
import sys

# logger name -> message fragments dropped from it
FILTERED: dict[str, tuple[str, ...]] = {
    "DeepSpeed": ("Setting accelerator to CPU", "untested optimizer"),
    "transformers.configuration_utils": ("to instantiate a model of type",),
    "transformers.tokenization_utils_base": ("Token indices sequence length is longer than the specified maximum",),
}


class DropMessages(logging.Filter):
    """Drops the records whose message contains one of ``fragments``."""

    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


def quiet_third_party() -> None:
    """Install the filters of :data:`FILTERED` (once per logger; the loggers need not exist yet:
    ``logging.getLogger`` returns the object the library configures later, filters included)."""
    for name, fragments in FILTERED.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMessages) for f in logger.filters):
            logger.addFilter(DropMessages(fragments))


def show_progress(requested: bool = True, stream=None) -> bool:
    """Whether to draw a progress bar: asked for and the stream (stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(requested) and stream.isatty()
    except (AttributeError, ValueError):  # closed or not a file
        return False


def quiet_progress() -> None:
    """No library progress bar when stderr is not a terminal: ``TQDM_DISABLE=1`` (tqdm reads it as
    the default of ``disable``; a bar created with an explicit ``disable=False`` still draws, which is
    how the project's own bars follow :func:`show_progress`). Inherited by the processes started
    from here. A value the user set is kept."""
    if not show_progress():
        os.environ.setdefault("TQDM_DISABLE", "1")
