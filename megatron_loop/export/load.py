"""Models read back: a LoopLM built plain from a training checkpoint (:func:`load_model_from_checkpoint`) or
from an export (:func:`load_looplm_from_hf`), and an export folder checked as ``from_pretrained`` would read
it (:func:`check_export`, :func:`load_hf_model`: what the loop sweep and the probes load). Every model here is
built plain (:func:`megatron_loop.model.build_model`: no process group).

torch, DeepSpeed, megatron-core and transformers are imported where a model is read, not at the top: the loop
sweep's command line imports this module and answers its argument errors without them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from megatron_loop.checkpoint.folders import CONFIG_NAME, load_run_config
from megatron_loop.checkpoint.selection import report_selection, select_checkpoint
from megatron_loop.errors import LoopConfigError, LoopDataError


def load_model_from_checkpoint(ckpt_dir: str | os.PathLike, tag: str | None = None, quiet: bool = False):
    """(LoopLM in fp32 eval mode, Config) from a training checkpoint folder (root or tag folder)."""
    import torch

    from megatron_loop.checkpoint.weights import read_weights_or_newest  # DeepSpeed's zero_to_fp32 (module docstring)
    from megatron_loop.model import build_model  # megatron-core, slow to import: only where a model is built

    chosen = select_checkpoint(ckpt_dir, tag)
    if not quiet:
        report_selection(chosen)
    cfg = load_run_config(chosen.root)
    chosen, state = read_weights_or_newest(chosen, ckpt_dir, tag)
    model = build_model(cfg.model)
    # megatron-core linears add ``_extra_state`` entries (None); only tensors are weights.
    expected = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    if set(state) != set(expected) or any(state[k].shape != expected[k].shape for k in state):
        missing = sorted(set(expected) - set(state))[:3]
        unexpected = sorted(set(state) - set(expected))[:3]
        raise LoopDataError(
            f"{chosen.path}: checkpoint does not match the architecture in {CONFIG_NAME} "
            f"(missing {missing}, unexpected {unexpected}, or shapes differ)")
    model.load_state_dict(state, strict=False)
    return model.eval(), cfg


def read_hf_state_dict(hf_dir: str | os.PathLike) -> dict:
    """All tensors of an exported folder (sharded or not)."""
    from safetensors.torch import load_file

    hf_dir = Path(hf_dir)
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise LoopDataError(f"{hf_dir}: no *.safetensors files; expected a folder written by convert_to_hf")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def load_looplm_from_hf(hf_dir: str | os.PathLike):
    """An exported HF folder -> the training ``LoopLM`` (fp32, eval mode), for probing."""
    from transformers import AutoConfig

    from megatron_loop.export.convert import from_hf_state_dict, model_config_from_hf  # torch (module docstring)
    from megatron_loop.model import build_model  # megatron-core: loaded only when a LoopLM is built from an export

    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise LoopDataError(f"{hf_dir / 'config.json'}: missing; expected a folder written by convert_to_hf")
    config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=True)
    cfg = model_config_from_hf(config)
    state = from_hf_state_dict({k: v.float() for k, v in read_hf_state_dict(hf_dir).items()}, cfg)
    model = build_model(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise LoopDataError(f"{hf_dir}: tensors missing {missing[:3]} / unexpected {unexpected[:3]} for {cfg.layout}")
    return model.eval()


def export_config(model_dir: str | Path) -> dict:
    """``config.json`` of an export, with the one-line error for a folder that is not one."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise LoopDataError(f"{path}: missing; expected a folder written by tools/convert_to_hf.py")
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoopDataError(f"{path}: not readable JSON ({' '.join(str(e).split())}); expected a folder written "
                            "by tools/convert_to_hf.py") from None


def _safetensors_header(path: Path) -> dict:
    """Tensor name -> shape of one safetensors file, from its header (8-byte length, JSON), and
    the file checked complete: the header's last data offset must end the file."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n)) if 8 <= size and n <= size - 8 else None
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        end = 8 + n + max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, TypeError, IndexError,
            ValueError):  # not JSON, or JSON of another shape
        raise LoopDataError(f"{path}: not a readable safetensors file ({size:,} bytes); expected the weights "
                            "written by tools/convert_to_hf.py") from None
    if size < end:
        raise LoopDataError(f"{path}: truncated ({size:,} bytes; its header describes {end:,}); expected the "
                            "complete file tools/convert_to_hf.py wrote")
    return {k: list(v["shape"]) for k, v in tensors.items()}


def _block(name: str) -> str:
    """``model.core.2.mlp.up_proj.weight`` -> ``model.core.2.*`` (a block's tensors named once)."""
    parts = name.split(".")
    i = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    return name if i is None else ".".join(parts[:i + 1]) + ".*"


def check_export(model_dir: str | Path) -> dict:
    """An export folder as ``from_pretrained`` would read it, checked before it is: ``config.json``
    (readable, and accepted by the config class: ``num_loops: 0`` is refused there), the model code
    its ``auto_map`` names, complete safetensors files, and tensors whose names and shapes are those
    of the architecture ``config.json`` describes (an edited ``core_layers`` would otherwise load
    random blocks, reported only in transformers' MISSING table). Returns ``config.json``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(model_dir)
    raw = export_config(folder)
    where = folder / "config.json"
    for ref in (raw.get("auto_map") or {}).values():
        code = folder / (ref.split("--")[-1].rsplit(".", 1)[0] + ".py")
        if not code.is_file():
            raise LoopDataError(f"{code}: missing; {where} names it in auto_map (the model's code); expected the "
                                "folder as tools/convert_to_hf.py wrote it")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise LoopDataError(f"{folder}: no *.safetensors files; expected a folder written by tools/convert_to_hf.py")
    stored = {name: (f, shape) for f in files for name, shape in _safetensors_header(f).items()}  # whole files
    from megatron_loop.export.output_folder import verify_export_shards  # and the bytes the export recorded

    verify_export_shards(folder)
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=True)
    except (ValueError, TypeError, KeyError) as e:  # the config class's own checks (LoopLMConfig)
        raise LoopDataError(f"{where}: {' '.join(str(e).split())}") from None
    aliases: dict[int, list] = {}  # tied parameters: one stored name serves all (lm_head = embeddings)
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append((name, list(param.shape)))
    layout = (f"{raw.get('prelude_layers')}+{raw.get('core_layers')}x{raw.get('train_loops')}+"
              f"{raw.get('coda_layers')}" if raw.get("model_type") == "looplm"
              else f"{raw.get('model_type')}, {raw.get('num_hidden_layers')} layers")
    missing = sorted({_block(names[0][0]) for names in aliases.values() if not any(n in stored for n, _ in names)})
    known = {n for names in aliases.values() for n, _ in names} | set(model.state_dict())  # + buffers
    unused = sorted({_block(n) for n in stored if n not in known})
    if missing or unused:
        what = "; ".join([*(["no weights for " + ", ".join(missing)] if missing else []),
                          *(["weights it has no place for: " + ", ".join(unused)] if unused else [])])
        raise LoopDataError(f"{folder}: the weights do not match {where} (layout {layout}): {what}; expected the "
                            "config.json written with these weights (was it edited after the export?)")
    for names in aliases.values():
        for name, shape in names:
            if name in stored and stored[name][1] != shape:
                raise LoopDataError(f"{stored[name][0]}: {name} has shape {stored[name][1]}, {where} describes "
                                    f"{shape}; expected the config.json written with these weights (vocab_size, "
                                    "hidden_size, intermediate_size and the heads as exported)")
    return raw


def load_hf_model(model_dir: str | Path, device: str | None = None, dtype: str = "float32"):
    """(model in eval mode on ``device``, tokenizer) from an exported folder (LoopLM or native),
    checked first (:func:`check_export`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in ("float32", "bfloat16", "float16"):
        raise LoopConfigError(f"--dtype {dtype!r}: expected float32, bfloat16 or float16")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model_dir = Path(model_dir)
    check_export(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True,
                                                 dtype=getattr(torch, dtype)).to(device).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)  # reads our config.json (auto_map)
    except Exception as e:  # no tokenizer files in the folder
        reason = " ".join(str(e).split())
        raise LoopDataError(f"{model_dir}: cannot load the tokenizer ({reason}); expected tokenizer files next to "
                            "the model (convert_to_hf.py --tokenizer)") from None
    return model, tokenizer
