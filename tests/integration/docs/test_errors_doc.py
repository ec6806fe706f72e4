"""docs/ERRORS.md is checked against the messages the code prints, both ways.

Code -> docs: every message template in the code (the first argument of ``raise
LoopConfigError / LoopDataError / NonFiniteStop / CollectiveFailure(...)``, the ``expected`` text
of the config's ``need(...)`` checks, ``print("error: ...")``, argparse's ``parser.error(...)``
and the ``ValueError``s of the export's config, ``hf/modeling_looplm.py``) is read from the
source (``ast``), cut at its ``{...}`` fields, and its longest literal piece must appear in
docs/ERRORS.md (backticks dropped, whitespace collapsed), unless :data:`NOT_IN_ERRORS_MD` lists it
with the reason it is not a user's message.

Docs -> code: every message of the docs' tables (a backticked cell in a "Message" column), cut at
its ``<...>`` placeholders, has its longest literal piece among the code's string literals, unless
:data:`NOT_LITERAL_IN_CODE` lists it (messages of argparse, PyYAML, transformers).

To extend at a merge: a new message is documented in docs/ERRORS.md (the failure says which file
and line printed it), or added to one of the two lists with its reason.
"""

from __future__ import annotations

import ast
import re
from testpaths import REPO

SOURCES = [*sorted(REPO.glob("megatron_loop/**/*.py")), *sorted(REPO.glob("tools/**/*.py")), REPO / "pretrain_loop.py"]
ERRORS_MD = REPO / "docs" / "ERRORS.md"
ERROR_TYPES = {"LoopConfigError", "LoopDataError", "NonFiniteStop", "CollectiveFailure"}
MIN_PIECE = 12  # shorter literal pieces ("=", ": expected ") identify nothing
STRIP = " :;,.'\"="

# Longest literal piece of a code message -> why docs/ERRORS.md does not list it.
NOT_IN_ERRORS_MD = {
    # guards of internal APIs: the config / CLI checks before them reject the same input with a documented line
    "unsupported annotation": "config/loading.py: a dataclass field type the loader cannot read (a programming error)",
    "micro_batch_size, grad_accum and data-parallel size must be >= 1": "the batch keys are checked at load",
    "give zero_stage or ds_config": "read_ds_config() called without either (code, not input)",
    "DeepSpeed config has ZeRO stage": "read_ds_config(file, stage) in tests: the file is not that stage",
    "expected scalar, channel or dense": "conditioning modules: model.history_injection is checked at load",
    "expected scalar, channel, residual_channel or dense": "conditioning: initial_injection is checked at load",
    "model.injection_init_noise: expected 0 for dense initial injection (the App. E.1 ablation covers scalar, "
    "channel and residual_channel)": "checked at load with the documented injection_init_noise message",
    "expected None (all loops) or an integer >= 1": "LoopLM.forward(backprop_loops=...) from Python; the config "
                                                    "key train.backprop_loops is checked at load",
    "exceeds model.max_position_embeddings": "LoopLM.forward on a longer input from Python; train.seq_length is "
                                             "checked at load",
    "probe sample: mask dtype": "probes/sampling.py internal consistency of the sample it builds",
    "do not match; expected [N, S] and [N, S-1]": "probes/sampling.py internal consistency",
    "expected integers >= 1": "probes/runner.py API; --loops is checked by the CLI first",
    "batch_size and skip_batch must be >= 1": "probes/runner.py API arguments",
    "block occurrences, expected D": "probes/runner.py: hooks saw another depth than the model (internal)",
    "global_batch_size, micro_batch_size and data-parallel size must be >= 1": "sampler API; checked at load",
    "expected a non-negative multiple of global_batch_size": "sampler API: consumed_samples of a checkpoint "
                                                             "written by the trainer",
    "expected one positive number per prefix": "blend API; data.train_weights is checked at load",
    "blend components; expected fewer than 32768": "blend API (megatron-core's int16 index)",
    "blend weights; expected one weight per prefix": "blend API; data.train_weights is checked at load",
    "expected at least 2 (one prediction)": "PackedDataset API; train.seq_length is checked at load",
    "expected at least 1": "PackedDataset / probe sampling API arguments",
    "expected distinct loop counts >= 1 in increasing order": "SweepSettings API; --loops is parsed first",
    "); expected tasksource/proofwriter, whose split holds": "inside lm-eval's document processing of the "
                                                            "shipped task (a dataset of another schema)",
    "is not one of CLUTRR/v1's 21 relation labels": "inside lm-eval's document processing of the shipped task",
    "expected a dataset built with enough epochs": "blend API: the loader sizes the components",
    "expected micro-batch x accumulation steps x data-parallel size = global batch":
        "sampler API; the documented batch check runs first",
    "expected 0 <= rank <": "sampler API: rank from torch.distributed",
    "expected loop counts >= 1": "preflight: train.eval_loops is checked at load with the documented message",
    "missing; expected by the architecture": "export/convert.py: a tensor the exporter expects (internal)",
    "has no place in the export of": "export/convert.py: a training tensor the exporter does not map (internal)",
    "tensors missing": "the exporter's own model does not take its state dict (internal); the reader's "
                       "'<HF>: tensors missing ...' is documented",
    "expected a number >= 0": "model/adaptive_exit.py API; the export's exit_threshold message is documented",
    "run python tools/generate_configs.py": "generate_configs.py --check, the developer's registry check",
    "tools/config_reference.py: no description for": "developer tool that regenerates docs/CONFIG.md",
    "is out of date; run python tools/config_reference.py": "developer tool (tests/integration/docs/test_docs.py)",
}

# A documented message (as written in docs/ERRORS.md) -> why the code's literals do not spell it out
# (a library prints it, or the code composes it at run time).
NOT_LITERAL_IN_CODE = {
    "a list of str": "config.loading._coerce composes it from the field's annotation",
    "dict or null": "config.loading._coerce composes it from the field's annotation",
    "--set '<text>': value is not valid YAML (<problem> at line <l>, column <c>)": "PyYAML's problem and mark, "
                                                                                 "put on one line by config/loading.py",
    "warning: skipping ...": "shorthand for the skipping messages above it in the same row",
    "pretrain_loop.py: error: the following arguments are required: --config": "argparse",
    "argument --data-parallel-size: invalid int value: 'abc'": "argparse",
    "unknown section '<name>'; expected one of ['data', 'logging', 'model', 'parallel', 'train']": "config/loading.py composes the "
                                                                                       "list from SECTIONS",
    "(We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the cached "
    "files)": "transformers (quoted inside our tokenizer message)",
}


def _template(node: ast.AST) -> str | None:
    """A string expression with every ``{...}`` field replaced by NUL; None if it is not one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return (_template(node.left) or "\0") + (_template(node.right) or "\0")
    return None


def _pieces(text: str, cut: str) -> list[str]:
    return [" ".join(p.split()).strip(STRIP) for p in re.split(cut, text)]


def code_messages() -> list[tuple[str, str]]:
    """(where, longest literal piece) of every message template in the code."""
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
            text = None
            if name in ERROR_TYPES or (name == "ValueError" and path.name == "modeling_looplm.py"):
                text = _template(node.args[0])
            elif name == "need" and len(node.args) >= 3:  # config/validation.py's need(condition, key, expected)
                text = _template(node.args[2])
            elif name == "print":
                line = _template(node.args[0])
                text = line[len("error: "):] if line and line.startswith("error: ") else None
            elif name == "error" and isinstance(fn, ast.Attribute):  # argparse parser.error(...)
                text = _template(node.args[0])
            if text is not None:
                piece = max(_pieces(text, "\0"), key=len)
                if len(piece) >= MIN_PIECE:
                    found.append((f"{path.relative_to(REPO)}:{node.lineno}", piece))
    return found


def documented_messages() -> list[str]:
    """The backticked messages of every table whose header has a "Message" column."""
    messages, column = [], None
    for line in ERRORS_MD.read_text().splitlines():
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if column is None:
            column = next((i for i, c in enumerate(cells) if c.startswith("Message")), -1)
            continue
        if column >= 0 and not set(line) <= set("|- "):
            messages += re.findall(r"`([^`]+)`", cells[column])
    return messages


def _normal(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def test_every_message_of_the_code_is_in_errors_md():
    doc = _normal(ERRORS_MD.read_text())
    missing = [f"{where}: {piece!r}" for where, piece in code_messages()
               if piece not in doc and piece not in NOT_IN_ERRORS_MD]
    assert not missing, "not in docs/ERRORS.md (document it, or list it in NOT_IN_ERRORS_MD):\n" + "\n".join(missing)


# Placeholders of the docs: <...>, "...", [...] lists, and the upper-case words of the checkpoint
# tables (OUT, CKPT, TAG, N, P2, ...).
UPPER_PLACEHOLDERS = ("OUT", "CKPT", "TAG", "TAG0", "TAG2", "FILE", "FOLDER", "PATH", "OLDER", "TIME", "HF", "DIR",
                      "KEY", "OLD", "NEW", "REASON", "PID", "XXXXXX", "N", "N2", "M", "P", "P2", "W", "W2", "R", "H",
                      "T")
PLACEHOLDER = r"<[^>]*>|\.\.\.|\[[^]]*\]|\b(?:" + "|".join(UPPER_PLACEHOLDERS) + r")\b"
MIN_COVERED = 0.6  # share of a documented message's literal text the code's literals must account for


def code_literal_pieces() -> set[str]:
    """Every literal piece of every string (constants and f-strings, cut at their fields) in the code."""
    pieces = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.JoinedStr, ast.Constant, ast.BinOp)):
                text = _template(node)
                pieces.update(p for p in (" ".join(x.split()) for x in (text or "").split("\0")) if len(p) >= 6)
    for path in sorted(REPO.glob("tools/*.sh")):  # shell tools: double-quoted strings, cut at their $variables
        for text in re.findall(r'"((?:[^"\\]|\\.)*)"', path.read_text()):
            pieces.update(p for p in (" ".join(x.split()) for x in re.split(r"\$\{?\w+\}?|\$\(", text))
                          if len(p) >= 6)
    return pieces


def covered_share(message: str, pieces: set[str]) -> float:
    """How much of ``message``'s literal text (between placeholders) occurs as code literals."""
    segments = [" ".join(seg.split()) for seg in re.split(PLACEHOLDER, message)]
    total = covered = 0
    for seg in segments:
        marks = [False] * len(seg)
        for piece in pieces:
            if piece in seg:
                start = seg.find(piece)
                while start >= 0:
                    marks[start:start + len(piece)] = [True] * len(piece)
                    start = seg.find(piece, start + 1)
            elif seg in piece:
                marks = [True] * len(seg)
                break
        total += sum(c not in STRIP for c in seg)
        covered += sum(m and c not in STRIP for m, c in zip(marks, seg))
    return covered / total if total else 1.0


def test_the_exception_lists_name_only_what_exists():
    pieces = {piece for _, piece in code_messages()}
    stale = sorted(set(NOT_IN_ERRORS_MD) - pieces)
    assert not stale, f"NOT_IN_ERRORS_MD names messages the code no longer has: {stale}"
    documented = set(documented_messages())
    assert not sorted(set(NOT_LITERAL_IN_CODE) - documented), "NOT_LITERAL_IN_CODE names messages not in ERRORS.md"


def test_every_documented_message_is_printed_by_the_code():
    pieces = code_literal_pieces()
    stale = []
    for message in documented_messages():
        if message in NOT_LITERAL_IN_CODE or len(re.sub(PLACEHOLDER, "", message)) < MIN_PIECE:
            continue
        share = covered_share(message, pieces)
        if share < MIN_COVERED:
            stale.append(f"{share:.0%} {message!r}")
    assert not stale, "in docs/ERRORS.md but not printed by the code (fix the text, or list it in " \
                      "NOT_LITERAL_IN_CODE):\n" + "\n".join(stale)


def test_the_check_sees_the_messages_it_claims_to():
    """Guards the extraction itself: known messages of each kind are found."""
    pieces = {piece for _, piece in code_messages()}
    assert "a float in [0, 1) (an exponential decay rate)" in pieces  # need(...)
    assert "--config FILE is required (or --list-configs)" in pieces  # print("error: ...")
    assert "expected a number >= 0 (0: never exit)" in pieces  # ValueError of the export's config
    assert any("only with --study NAME" in p for p in pieces)  # argparse parser.error(...)
    assert len(documented_messages()) > 150
    literals = code_literal_pieces()
    assert covered_share("CKPT/latest: missing; expected the tag of the checkpoint to resume from", literals) > 0.95
    # a reworded message (docs/ERRORS.md once described convert_to_hf.py's missing 'latest' this way) is caught
    assert covered_share("CKPT/latest: no such tag file, the export cannot choose a checkpoint", literals) < MIN_COVERED
