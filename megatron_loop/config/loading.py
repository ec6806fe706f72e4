"""Loading a config: YAML (read by :mod:`megatron_loop.config.yaml_reader`: plain data only) ->
``--set key.path=value`` overrides -> typed sections (each value checked against its field's
annotation) -> validation -> absolute paths. Every error names the key and what was expected."""

from __future__ import annotations

import json
import math
import re
import sys
import types
from decimal import Decimal
from dataclasses import fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from megatron_loop.config.paths import resolve_paths
from megatron_loop.config.presets import BACKBONES
from megatron_loop.config.sections import SECTIONS, Config, ModelConfig
from megatron_loop.config.validation import CHOICES
from megatron_loop.config.yaml_reader import read_yaml, yaml_problem
from megatron_loop.errors import LoopConfigError, file_problem


# Keys renamed (old section.key -> new key of the same section). A config written with the old name still
# loads; the first use in a process says so once on stderr (a run config saved before the rename, an old YAML).
RENAMED_KEYS = {
    "model.activation_checkpointing": "recompute",
    "model.activation_checkpointing_budget_gib": "recompute_budget_gib",
    "model.activation_checkpointing_selective_cost": "recompute_selective_cost",
}
_said: set[str] = set()


def renamed(section: str, values: dict) -> dict:
    """``values`` (one section's mapping) with every old key of :data:`RENAMED_KEYS` under its new name;
    both names at once is an error naming them."""
    values = dict(values)
    for old, new in RENAMED_KEYS.items():
        old_section, _, old_key = old.partition(".")
        if old_section != section or old_key not in values:
            continue
        if new in values:
            raise LoopConfigError(f"{section}.{old_key}: the old name of {section}.{new}, both given; expected only "
                                  f"{section}.{new}")
        values[new] = values.pop(old_key)
        if old not in _said:
            _said.add(old)
            print(f"note: {old} is now {section}.{new} (renamed: activation recomputation, not an on-disk "
                  "checkpoint); the old name still loads", file=sys.stderr)
    return values


# "1e9", "2.5E+3": numbers YAML 1.1 reads as strings (its floats need a dot); accepted where the
# field is a number and the value is one
_SCIENTIFIC = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "null")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (bool is not an int, int is a float)."""
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except LoopConfigError as e:
                errors.append(e)
        # a value of the right kind with a bad part (a list holding a NaN): that part's own error, not "expected
        # list or null"
        same_kind = [e for a, e in zip([a for a in args if a is not type(None)], errors)
                     if isinstance(value, get_origin(a) or a)]
        if len(same_kind) == 1:
            raise same_kind[0]
        raise LoopConfigError(f"{key}={value!r}: expected {' or '.join(_type_name(a) for a in args)}")
    if origin is list:
        (item,) = get_args(tp)
        if not isinstance(value, list):
            raise LoopConfigError(f"{key}={value!r}: expected a list of {_type_name(item)}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise LoopConfigError(f"{key}={value!r}: expected a boolean (true/false)")
    if tp is int:
        if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
            value = Decimal(value.strip())  # YAML 1.1 reads "1e9" (no dot) as a string; exact, unlike float
        if isinstance(value, Decimal):
            if value != value.to_integral_value():
                raise LoopConfigError(f"{key}={str(value)!r}: expected an integer")
            return int(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not value.is_integer()):
            raise LoopConfigError(f"{key}={value!r}: expected an integer")
        return int(value)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LoopConfigError(f"{key}={value!r}: expected a number")
        if not math.isfinite(float(value)):
            raise LoopConfigError(f"{key}={value!r}: expected a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            choices = f"one of {CHOICES[key]}" if key in CHOICES else "a string"
            # YAML 1.1 reads an unquoted on/off/yes/no as a boolean
            hint = " (YAML reads an unquoted on/off/yes/no as a boolean: quote it)" if isinstance(value, bool) else ""
            raise LoopConfigError(f"{key}={value!r}: expected {choices}{hint}")
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise LoopConfigError(f"{key}={value!r}: expected a mapping")
        return dict(value)
    raise LoopConfigError(f"{key}: unsupported annotation {tp}")


def _build_section(cls: type, values: dict, section: str) -> Any:
    values = renamed(section, values)
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise LoopConfigError(f"{section}.{unknown[0]}: unknown key; {_closest(unknown[0], known)}")
    kwargs = {k: _coerce(v, hints[k], f"{section}.{k}") for k, v in values.items()}
    return cls(**kwargs)


# Names other trainers give a key of this config (Megatron-LM, Hugging Face Trainer, nanoGPT): suggested when
# the spelling is not close to any key
ALIASES = {"learning_rate": "lr", "min_lr": "min_lr_ratio", "warmup_steps": "warmup_fraction",
           "warmup_iters": "warmup_fraction", "batch_size": "global_batch_size", "micro_batch": "micro_batch_size",
           "train_iters": "max_steps", "max_iters": "max_steps", "num_steps": "max_steps",
           "clip_grad": "grad_clip", "max_grad_norm": "grad_clip", "seq_len": "seq_length", "n_embd": "hidden_size",
           "ffn_hidden_size": "intermediate_size", "num_heads": "num_attention_heads", "n_head": "num_attention_heads",
           "num_layers": "core_layers", "n_layer": "core_layers", "num_loops": "train_loops",
           "data_path": "train_prefixes", "tokenizer_path": "tokenizer", "save": "output_dir", "out_dir": "output_dir"}


def _closest(name: str, known) -> str:
    """``did you mean 'lr'?`` for a misspelt or foreign key name; the whole list only when nothing is close."""
    import difflib

    names = {**{alias: key for alias, key in ALIASES.items() if key in known}, **{key: key for key in known}}
    close = difflib.get_close_matches(str(name).lower(), sorted(names), n=1, cutoff=0.75)
    if close:
        guess = names[close[0]]
        return f"did you mean '{guess}'? (docs/CONFIG.md lists every key)"
    return f"expected one of {sorted(known)}"


def build_model_config(values: dict, section: str = "model") -> ModelConfig:
    """A ModelConfig from a mapping; ``backbone`` fills every field the mapping leaves out."""
    values = renamed(section, values)
    backbone = values.get("backbone")
    if backbone is not None:
        if not isinstance(backbone, str) or backbone not in BACKBONES:
            raise LoopConfigError(
                f"{section}.backbone={backbone!r}: unknown backbone; expected one of {sorted(BACKBONES)}")
        preset = BACKBONES[backbone]
        # a mapping given for a mapping field of the preset (rope_scaling: {factor: 4}, or
        # --set model.rope_scaling.factor=4) updates the preset's keys; null replaces it
        values = {**preset, **values, **{k: {**preset[k], **v} for k, v in values.items()
                                         if isinstance(v, dict) and isinstance(preset.get(k), dict)}}
    cfg = _build_section(ModelConfig, values, section)
    cfg.validate(section)
    return cfg


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise LoopConfigError(f"--set {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if len(path) < 2 or not all(path):
        raise LoopConfigError(f"--set {text!r}: expected section.key=value (e.g. model.train_loops=3)")
    try:
        value = read_yaml(raw, path) if raw.strip() else ""
    except LoopConfigError as e:
        raise LoopConfigError(f"--set {text!r}: {e}") from None
    except yaml.YAMLError as e:
        raise LoopConfigError(f"--set {text!r}: value is not valid YAML ({yaml_problem(e)})") from None
    return path, value


def config_from_dict(raw: dict, source: str = "<dict>", overrides: list[str] | None = None) -> Config:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise LoopConfigError(f"{source}: expected a mapping with sections {sorted(SECTIONS)}")
    raw = json.loads(json.dumps(raw))  # deep copy of plain data
    for ov in overrides or []:
        path, value = _parse_override(ov)
        node = raw
        for part in path[:-1]:
            if node.get(part) is None:  # absent or null (rope_scaling: null): the override starts it
                node[part] = {}
            nxt = node[part]
            if not isinstance(nxt, dict):
                raise LoopConfigError(f"--set {ov!r}: {part!r} is not a section")
            node = nxt
        node[path[-1]] = value
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        import difflib

        close = difflib.get_close_matches(str(unknown[0]), sorted(SECTIONS), n=1, cutoff=0.75)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise LoopConfigError(f"{source}: unknown section {unknown[0]!r}; {hint}expected one of {sorted(SECTIONS)}")
    for name, val in raw.items():
        if not isinstance(val, dict):
            raise LoopConfigError(f"{source}: section {name!r} must be a mapping")
    try:
        # the model section takes its backbone preset first; every other section is built as typed
        sections = {name: build_model_config(raw.get(name, {})) if cls is ModelConfig
                    else _build_section(cls, raw.get(name, {}), name) for name, cls in SECTIONS.items()}
        cfg = Config(**sections, source=source)
        cfg.validate()
    except LoopConfigError as e:
        raise LoopConfigError(f"{source}: {e}") from None
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (SPEC.md "Config vocabulary"), apply ``key.path=value`` overrides, validate,
    and make its file paths absolute (:func:`resolve_paths`, relative to the working directory)."""
    path = Path(path)
    if not path.is_file():
        problem = file_problem(str(path))
        if problem.startswith("missing "):
            raise LoopConfigError(f"{path}: config file not found")
        # a folder, /dev/null, a pipe: named as what it is (it exists: "not found" would send the user looking)
        raise LoopConfigError(f"{problem}; expected a YAML config file")
    try:
        raw = read_yaml(path.read_text(encoding="utf-8"))
    except LoopConfigError as e:
        raise LoopConfigError(f"{path}: {e}") from None
    except UnicodeDecodeError:
        raise LoopConfigError(f"{path}: not a text file; expected a YAML config (UTF-8)") from None
    except yaml.YAMLError as e:
        raise LoopConfigError(f"{path}: not valid YAML ({yaml_problem(e)})") from None
    cfg = config_from_dict(raw, source=str(path), overrides=overrides)
    try:
        return resolve_paths(cfg)
    except LoopConfigError as e:  # two spellings of one prefix, found once the paths are real
        raise LoopConfigError(f"{path}: {e}") from None
