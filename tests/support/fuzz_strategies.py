"""Hypothesis strategies of the bad-input fuzz suite: values a user can type (garbage text, numbers at and past
every edge, paths of every kind), command lines derived from each script's own argparse parser, config
values by each key's annotation, launch environments. Paths a command may write to stay in its scratch
working directory (relative names) or are ``/dev/null``: a fuzzed ``--output /`` run as root would write
where it should not."""

from __future__ import annotations

import argparse
import functools
import math
from dataclasses import fields
from typing import Any, get_args, get_origin, get_type_hints

from hypothesis import strategies as st

from fuzz_fixtures import FuzzAssets, run_entry, script_module

# Text a shell can pass (no NUL), spaces, unicode digits and look-alikes, option-looking words
TEXT = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
    st.sampled_from(["", " ", "-", "--", "-1", "none", "None", "null", "all", "x", "1,", ",1", "1,,2", "٣", "1e3",
                     "0x10", "1_000", " 7 ", "nan", "inf", "-inf", "∞", "\t", "a=b", "=", "~", "..", "*"]))
INTEGERS = st.one_of(st.integers(-3, 40), st.sampled_from([0, -1, 1025, 2**31, 2**32, 2**63, 10**9, 10**30]))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.0, 1e-320, 5e-324, 1e308, -1e308, 0.5, 1.5, 2.7]))
NUMBER_TEXT = st.one_of(INTEGERS.map(str), FLOATS.map(repr), st.sampled_from(["1e9", "1E-3", "+3", "3.", ".5"]))
LOOP_LISTS = st.one_of(st.lists(INTEGERS, max_size=4).map(lambda v: ",".join(map(str, v))), TEXT)
OUTPUTS = st.sampled_from(["out", "out/sub", "", ".", "out.png", "a b", "/dev/null", "x.pdf", "o.svg", "o.txt"])


def input_paths(assets: FuzzAssets) -> st.SearchStrategy[str]:
    """Paths of every kind a read argument may be given: missing, a folder, a device, each asset."""
    return st.sampled_from([
        "missing", "missing/deeper", "/dev/null", "/dev/zero", "/proc", str(assets.root / "nothing"),
        str(assets.corpus), str(assets.tokenizer), str(assets.tokenizer / "tokenizer.json"), assets.prefix,
        assets.prefix + "_valid", assets.prefix + ".bin", str(assets.config), str(assets.checkpoint),
        str(assets.checkpoint / "global_step1"), str(assets.checkpoint.parent), str(assets.export),
        str(assets.export / "config.json"), str(assets.metrics), str(assets.metrics / "metrics.jsonl"),
        str(assets.root), "", "."])


def capture_parser(script: str) -> argparse.ArgumentParser:
    """The parser ``script``'s ``main`` builds (parse_args patched to hand it over instead of parsing)."""
    return _captured(script)


class _Captured(BaseException):
    pass


@functools.lru_cache(maxsize=None)
def _captured(script: str) -> argparse.ArgumentParser:
    original = argparse.ArgumentParser.parse_args

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture
    try:
        script_module(script).main([])
    except _Captured as e:
        return e.args[0]
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"{script}: main() parsed no arguments")


def actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every option and positional, those of subcommands included (help excluded)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += actions(sub)
            continue
        found.append(action)
    return found


def values_for(action: argparse.Action, assets: FuzzAssets) -> st.SearchStrategy[str]:
    """What a user might pass to ``action``: by its choices, its type and its name."""
    name = action.dest
    pools = [TEXT, NUMBER_TEXT]
    if action.choices:
        pools.append(st.sampled_from([str(c) for c in action.choices]))
    if action.type in (int, float):
        pools += [NUMBER_TEXT, NUMBER_TEXT]
    if any(w in name for w in ("output", "toy_dir", "json")):
        pools = [OUTPUTS, OUTPUTS, TEXT]
    elif any(w in name for w in ("loops", "tp", "thresholds", "lag", "sources", "positions")):
        pools += [LOOP_LISTS, LOOP_LISTS]
    elif name == "overrides" or name == "set":
        pools.append(config_overrides())
    elif any(w in name for w in ("config", "model", "checkpoint", "tokenizer", "input", "prefix", "path", "runs",
                                 "replot", "reference", "compare", "run", "hf_model", "data")):
        pools += [input_paths(assets), input_paths(assets)]
    return st.one_of(*pools)


@st.composite
def command_lines(draw, script: str, bases: list[list[str]], assets: FuzzAssets) -> list[str]:
    """One of ``bases`` (command lines that reach the work) with one to three of its parser's arguments set to a
    drawn value, dropped, or joined by a word argparse does not know."""
    argv = list(draw(st.sampled_from(bases)))
    options = actions(capture_parser(script))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(options))
        flag = draw(st.sampled_from(action.option_strings)) if action.option_strings else None
        kind = draw(st.sampled_from(["set", "set", "set", "set", "drop", "word"]))
        if kind == "word":
            argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(["--nosuch", "-z", "--", "extra", ""])))
        elif flag is None:  # a positional: replaced where it is, or added
            argv.insert(0 if not argv or argv[0].startswith("-") else 1, draw(values_for(action, assets)))
        elif kind == "drop":
            if flag in argv:
                i = argv.index(flag)
                del argv[i:i + (1 if action.nargs == 0 else 2)]
        elif action.nargs == 0:
            argv.append(flag)
        else:
            value = draw(values_for(action, assets))
            if flag in argv and argv.index(flag) + 1 < len(argv) and draw(st.booleans()):
                argv[argv.index(flag) + 1] = value
            elif draw(st.booleans()):
                argv += [flag, value]
            else:
                argv.append(f"{flag}={value}")
    return argv


# ----------------------------------------------------------------------------------------------------------
# Config values


def config_keys() -> list[tuple[str, str, Any]]:
    """(section, key, annotation) of every key of every section."""
    from megatron_loop.config.sections import SECTIONS

    return [(section, f.name, get_type_hints(cls)[f.name]) for section, cls in SECTIONS.items() for f in fields(cls)]


SCALARS = st.one_of(INTEGERS, FLOATS, st.booleans(), st.none(), TEXT)
NESTED = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(TEXT, inner, max_size=3)), max_leaves=6)


def yaml_text(value: Any) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip().removesuffix("\n...").strip()


@st.composite
def config_overrides(draw) -> str:
    """``section.key=value``: a real key (or a misspelt one) and a value of any kind."""
    section, key, _ = draw(st.sampled_from(config_keys()))
    if draw(st.integers(0, 9)) == 0:
        key = key[:-1] or "x"
    return f"{section}.{key}={yaml_text(draw(NESTED))}"


def wrong_kind(value: Any, annotation: Any) -> bool:
    """Whether ``value`` cannot be a value of ``annotation`` under any reading (the loader must refuse it):
    a container for a scalar or the other way round, a boolean for a number, string or list, a NaN or an
    infinity for a number, null for a key that is not optional."""
    options = [a for a in get_args(annotation)] if get_origin(annotation) in (__import__("typing").Union,
                                                                                __import__("types").UnionType) \
        else [annotation]
    if value is None:
        return type(None) not in options
    return all(_wrong_for(value, a) for a in options if a is not type(None))


def _wrong_for(value: Any, tp: Any) -> bool:
    origin = get_origin(tp) or tp
    if origin is list:
        return not isinstance(value, list)
    if origin is dict:
        return not isinstance(value, dict)
    if isinstance(value, (list, dict)):
        return True
    if tp is bool:
        return not isinstance(value, bool)
    if isinstance(value, bool):
        return tp in (int, float, str)
    if tp in (int, float) and isinstance(value, float) and not math.isfinite(value):
        return True
    if tp is str:
        return not isinstance(value, str)
    return False


def launch_values() -> st.SearchStrategy[str]:
    return st.one_of(INTEGERS.map(str), TEXT, st.sampled_from(["1", "2", "0", " 1", "1 ", "+1", "1.0", "one"]))


__all__ = ["FuzzAssets", "capture_parser", "command_lines", "config_keys", "config_overrides", "input_paths",
           "launch_values", "run_entry", "values_for", "wrong_kind", "yaml_text", "NESTED", "TEXT"]
