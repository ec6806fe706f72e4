"""Training checkpoint <-> Hugging Face folder (SPEC.md "HF export contract").

Export: pick and verify the checkpoint as training does
(:func:`megatron_loop.checkpoint.selection.select_checkpoint`: the one ``latest`` names, checked
against its manifest, else the newest complete one), consolidate it (any ZeRO stage), rename
every tensor to the export names, split megatron-core's fused matrices, and write ``config.json``
(with ``auto_map``), ``modeling_looplm.py``, sharded safetensors, the tokenizer and a generation
config into a hidden temporary folder next to the output, readable as the user's umask says
(:func:`megatron_loop.atomic.publish_folder`): it replaces the output only when complete, and an
old export is swapped out, not deleted first.

* fused QKV ``[groups, (heads/groups + 2) * head_dim]`` rows -> ``q_proj``, ``k_proj``,
  ``v_proj`` (grouped-query layout de-interleaved with ``roles.QKVSplit``);
* fused SwiGLU ``fc1 = [gate; up]`` -> ``gate_proj``, ``up_proj``;
* a NonLoop model (one loop, no conditioning) is written as a native ``LlamaForCausalLM``
  (``qk_norm`` false) or ``Qwen3ForCausalLM`` (``qk_norm`` true) with no remote code.

The inverse, an exported folder back to the training ``LoopLM``, is :func:`megatron_loop.export.load.load_looplm_from_hf`.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import torch

from megatron_loop.atomic import clean_leftovers, publish_folder, staging_folder
from megatron_loop.checkpoint.folders import CONFIG_NAME, MANIFEST, load_run_config, recorded_run_name
from megatron_loop.checkpoint.selection import report_selection, select_checkpoint
from megatron_loop.checkpoint.weights import read_weights_or_newest
from megatron_loop.config import ModelConfig, build_model_config
from megatron_loop.data.tokenizer import open_tokenizer, tokenizer_fingerprint
from megatron_loop.errors import LoopConfigError, LoopDataError, write_failure
from megatron_loop.export.output_folder import (ExportLock, check_not_a_run, check_not_in_a_checkpoint,
                                                check_replaceable, write_export_record)
from megatron_loop.model.roles import GateUpSplit, QKVSplit

DEFAULT_MAX_SHARD_SIZE = "2GB"

# Training-model suffix -> export suffix, per block (fused matrices are handled separately).
_BLOCK_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "attn_gate.q": "attn_gate.q",
    "mlp_gate.q": "mlp_gate.q",
    "attn_adaln.weight": "attn_adaln.weight",
    "mlp_adaln.weight": "mlp_adaln.weight",
    "attn_adaln.bias": "attn_adaln.bias",  # LoopFormer's shortcut modulation (model.timestep: shortcut)
    "mlp_adaln.bias": "mlp_adaln.bias",
    "attn_residual_norm.weight": "attn_residual_norm.weight",  # Huginn's sandwich norms (model.block_norm)
    "mlp_residual_norm.weight": "mlp_residual_norm.weight",
    "attn_output_norm.weight": "attn_output_norm.weight",  # Ouro's branch-output norms (block_norm: branch_output)
    "mlp_output_norm.weight": "mlp_output_norm.weight",
}
_QKV = "self_attention.linear_qkv.weight"
_FC1 = "mlp.linear_fc1.weight"
_QKV_PARTS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_FC1_PARTS = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
_PARTS = ("prelude", "core", "coda")


# --------------------------------------------------------------------------------------
# Which class, which config
# --------------------------------------------------------------------------------------


def is_native(cfg: ModelConfig) -> bool:
    """NonLoop (one loop) without any conditioning: a plain Llama / Qwen3 stack."""
    return (cfg.train_loops == 1 and cfg.initial_injection == "none" and cfg.history_injection == "none"
            and cfg.timestep == "none" and cfg.exit_gate == "none" and not huginn_fields(cfg) and not cfg.loop_norm)


def huginn_fields(cfg: ModelConfig) -> dict:
    """Huginn's export fields (model/initial_state.py, model/layers.py); empty at their defaults."""
    if (cfg.block_norm, cfg.norm_core_output, cfg.initial_state) == ("pre", False, "prelude"):
        return {}
    from megatron_loop.model.initial_state import state_std  # loads transformers: only when an export is built

    return dict(block_norm=cfg.block_norm, norm_core_output=cfg.norm_core_output, initial_state=cfg.initial_state,
                initial_state_std=state_std(cfg), initial_state_seed=cfg.initial_state_seed)


def rope_parameters(cfg: ModelConfig) -> dict:
    if cfg.rope_scaling is None:
        return {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    return {**cfg.rope_scaling, "rope_theta": float(cfg.rope_theta)}


def _common_fields(cfg: ModelConfig) -> dict:
    return dict(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_norm_eps,
                rope_parameters=rope_parameters(cfg), max_position_embeddings=cfg.max_position_embeddings,
                initializer_range=cfg.initializer_range, tie_word_embeddings=cfg.tie_word_embeddings,
                hidden_act="silu")


def hf_config(cfg: ModelConfig, token_ids: dict | None = None, train_seq_length: int | None = None,
              run_name: str | None = None):
    """The transformers config object of the export (LoopLMConfig, LlamaConfig or Qwen3Config).

    ``train_seq_length`` (the run's ``train.seq_length``) is recorded as an extra field so that
    ``tools/eval_loops.py`` measures the held-out loss at the length the model was trained on, and
    ``run_name`` (what training called the run) so that its figures name the model as training did."""
    token_ids = dict(token_ids or {})
    if train_seq_length is not None:
        token_ids["train_seq_length"] = int(train_seq_length)
    if run_name:
        token_ids["run_name"] = str(run_name)
    if is_native(cfg):
        depth = cfg.physical_depth
        if cfg.qk_norm:
            from transformers import Qwen3Config
            return Qwen3Config(**_common_fields(cfg), num_hidden_layers=depth, attention_bias=False,
                               use_sliding_window=False, **token_ids)
        from transformers import LlamaConfig
        return LlamaConfig(**_common_fields(cfg), num_hidden_layers=depth, attention_bias=False, mlp_bias=False,
                           **token_ids)
    from megatron_loop.hf.modeling_looplm import LoopLMConfig  # transformers: loaded only when an export is built
    return LoopLMConfig(**_common_fields(cfg), prelude_layers=cfg.prelude_layers, core_layers=cfg.core_layers,
                        train_loops=cfg.train_loops, coda_layers=cfg.coda_layers, num_loops=cfg.train_loops,
                        qk_norm=cfg.qk_norm, initial_injection=cfg.initial_injection,
                        history_injection=cfg.history_injection, history_window=cfg.history_window,
                        timestep=cfg.timestep, timestep_grid=cfg.timestep_grid,
                        loop_gating_reference=cfg.loop_gating_reference, exit_gate=cfg.exit_gate, **huginn_fields(cfg),
                        **({"loop_norm": True} if cfg.loop_norm else {}), **token_ids)


def model_config_from_hf(config) -> ModelConfig:
    """Our ModelConfig from an exported config (LoopLM, Llama or Qwen3)."""
    rope = dict(config.rope_parameters)
    theta = rope.pop("rope_theta")
    scaling = None if rope.get("rope_type", "default") == "default" else rope
    fields = dict(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                  num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
                  head_dim=config.head_dim, vocab_size=config.vocab_size, rms_norm_eps=config.rms_norm_eps,
                  rope_theta=theta, rope_scaling=scaling, max_position_embeddings=config.max_position_embeddings,
                  tie_word_embeddings=config.tie_word_embeddings, initializer_range=config.initializer_range)
    if config.model_type == "looplm":
        fields.update(prelude_layers=config.prelude_layers, core_layers=config.core_layers,
                      train_loops=config.train_loops, coda_layers=config.coda_layers, qk_norm=config.qk_norm,
                      initial_injection=config.initial_injection, history_injection=config.history_injection,
                      history_window=config.history_window, timestep=config.timestep,
                      timestep_grid=config.timestep_grid,
                      # absent from exports written before the switch existed: the original reading
                      loop_gating_reference=getattr(config, "loop_gating_reference", "state"),
                      exit_gate=getattr(config, "exit_gate", "none"),  # Ouro's gate: absent from older exports
                      # Huginn's fields, absent from older exports: the defaults
                      block_norm=getattr(config, "block_norm", "pre"),
                      norm_core_output=getattr(config, "norm_core_output", False),
                      initial_state=getattr(config, "initial_state", "prelude"),
                      loop_norm=getattr(config, "loop_norm", False))  # Ouro's between-loop norm: older exports, off
        if fields["initial_state"] == "noise":
            fields.update(initial_state_std=config.initial_state_std, initial_state_seed=config.initial_state_seed)
    elif config.model_type in ("llama", "qwen3"):
        fields.update(prelude_layers=0, core_layers=config.num_hidden_layers, train_loops=1, coda_layers=0,
                      qk_norm=config.model_type == "qwen3")
    else:
        raise LoopDataError(f"model_type {config.model_type!r}: expected 'looplm', 'llama' or 'qwen3'")
    return build_model_config(fields)


# --------------------------------------------------------------------------------------
# Tensor names
# --------------------------------------------------------------------------------------


def _fused_rows(cfg: ModelConfig):
    qkv = QKVSplit(num_groups=cfg.num_key_value_heads,
                   heads_per_group=cfg.num_attention_heads // cfg.num_key_value_heads, head_dim=cfg.head_dim)
    return qkv.row_index(), GateUpSplit(cfg.intermediate_size).row_index()


def _block_positions(cfg: ModelConfig, native: bool):
    """(training prefix, export prefix) per block; native stacks number prelude, core, coda as layers."""
    counts = {"prelude": cfg.prelude_layers, "core": cfg.core_layers, "coda": cfg.coda_layers}
    layer = 0
    for part in _PARTS:
        for i in range(counts[part]):
            yield f"{part}.{i}.", (f"model.layers.{layer}." if native else f"model.{part}.{i}.")
            layer += 1


def to_hf_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Training state dict (``LoopLM`` names, fused QKV / fc1) -> export names (split matrices)."""
    state = {k: v for k, v in state.items() if not k.endswith("_extra_state")}
    native = is_native(cfg)
    qkv_rows, fc1_rows = _fused_rows(cfg)
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in state:
            raise LoopDataError(f"checkpoint tensor '{name}' missing; expected by the architecture "
                                f"{cfg.layout} in the run config")
        used.add(name)
        return state[name]

    out["model.embed_tokens.weight"] = take("embed_tokens.weight")
    out["model.norm.weight"] = take("norm.weight")
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = take("lm_head.weight")
    for src, dst in _block_positions(cfg, native):
        for old, new in _BLOCK_RENAMES.items():
            if src + old in state:
                out[dst + new] = take(src + old)
        for name, rows in zip(_QKV_PARTS, qkv_rows):
            out[dst + name] = take(src + _QKV).index_select(0, rows)
        for name, rows in zip(_FC1_PARTS, fc1_rows):
            out[dst + name] = take(src + _FC1).index_select(0, rows)
    for name in state:
        if name.split(".")[0] in ("initial_injection", "history_injection", "loop_gating", "exit_gate",
                                  "shortcut_embedding"):
            out["model." + name] = take(name)
    unused = sorted(set(state) - used)
    if unused:
        raise LoopDataError(f"checkpoint tensor '{unused[0]}' has no place in the export of {cfg.layout} "
                            f"(initial_injection={cfg.initial_injection}, history_injection="
                            f"{cfg.history_injection}, timestep={cfg.timestep})")
    return {k: v.contiguous() for k, v in out.items()}


def from_hf_state_dict(hf_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Inverse of :func:`to_hf_state_dict`: export names -> training names (fused matrices rebuilt)."""
    native = is_native(cfg)
    qkv_rows, fc1_rows = _fused_rows(cfg)
    out = {"embed_tokens.weight": hf_state["model.embed_tokens.weight"], "norm.weight": hf_state["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = hf_state["lm_head.weight"]

    def fuse(prefix: str, names: tuple[str, ...], rows: list[torch.Tensor]) -> torch.Tensor:
        parts = [hf_state[prefix + n] for n in names]
        fused = parts[0].new_empty(sum(p.shape[0] for p in parts), parts[0].shape[1])
        for p, r in zip(parts, rows):
            fused[r] = p
        return fused

    for src, dst in _block_positions(cfg, native):
        for old, new in _BLOCK_RENAMES.items():
            if dst + new in hf_state:
                out[src + old] = hf_state[dst + new]
        out[src + _QKV] = fuse(dst, _QKV_PARTS, qkv_rows)
        out[src + _FC1] = fuse(dst, _FC1_PARTS, fc1_rows)
    for name, tensor in hf_state.items():
        if name.split(".")[1] in ("initial_injection", "history_injection", "loop_gating", "exit_gate",
                                  "shortcut_embedding"):
            out[name[len("model."):]] = tensor
    return out


# --------------------------------------------------------------------------------------
# Writing and reading folders
# --------------------------------------------------------------------------------------


def _prepare_output(output: Path, overwrite: bool) -> None:
    for note in clean_leftovers(output):  # first: a previous export killed mid-swap is put back
        print(f"note: {note}", file=sys.stderr)
    if output.exists() and not output.is_dir():
        raise LoopDataError(f"{output}: exists and is not a folder; expected an empty or new output folder")
    check_not_in_a_checkpoint(output)
    if output.is_dir() and any(output.iterdir()):
        check_not_a_run(output)
        if not overwrite:
            raise LoopDataError(f"{output}: output folder is not empty; pass --overwrite to replace it")
        check_replaceable(output)



def _load_tokenizer(tokenizer: str | None, source: str | None = None):
    if tokenizer is None:
        return None
    return open_tokenizer(tokenizer, source)


def decoder_tokenizer(tok, max_length: int):
    """Make ``tok`` (saved into the export) pad as a decoder-only model generates: on the left, so
    that every prompt of a batch ends at the last position and the next token follows its own text
    (right padding makes ``generate`` continue the shorter prompts after their pad tokens). A
    tokenizer without a pad token pads with EOS (as Llama-3 exports do; the attention mask hides
    the pads). ``model_max_length`` becomes the model's position range (``max_position_embeddings``)
    instead of transformers' "no limit" (1e30), so that ``truncation=True`` cuts prompts to what the
    model can position; not the training length (``train.seq_length``, recorded in config.json as
    ``train_seq_length``): a longer prompt runs fine, and the tokenizer would warn on each one that it
    "will result in indexing errors", a false alarm."""
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    tok.model_max_length = int(max_length)
    # save_pretrained writes init_kwargs, not the attributes: record both settings there too.
    tok.init_kwargs.update(padding_side="left", model_max_length=int(max_length))
    return tok


def export_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig, output: str | os.PathLike,
                      tokenizer: str | None = None, overwrite: bool = False,
                      max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE, tokenizer_source: str | None = None,
                      train_seq_length: int | None = None, run_name: str | None = None) -> Path:
    """Write the HF folder for a training state dict; returns the folder. ``tokenizer_source`` names
    where ``tokenizer`` came from in error messages (default: the ``--tokenizer`` flag);
    ``train_seq_length`` goes to config.json (:func:`hf_config`). One export at a time per output
    folder (:class:`megatron_loop.export.output_folder.ExportLock`)."""
    with ExportLock(Path(output)):
        return _export_state_dict(state, cfg, Path(output), tokenizer, overwrite, max_shard_size, tokenizer_source,
                                  train_seq_length, run_name)


def _export_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig, output: Path, tokenizer: str | None,
                       overwrite: bool, max_shard_size: str | int, tokenizer_source: str | None,
                       train_seq_length: int | None, run_name: str | None = None) -> Path:
    from transformers import AutoModelForCausalLM, GenerationConfig

    _prepare_output(output, overwrite)
    tok = _load_tokenizer(tokenizer, tokenizer_source)
    if tok is not None:
        decoder_tokenizer(tok, cfg.max_position_embeddings)
    token_ids = {}
    if tok is not None:
        token_ids = {k: getattr(tok, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                     if getattr(tok, k, None) is not None}
        if len(tok) > cfg.vocab_size:
            raise LoopDataError(f"tokenizer '{tokenizer}' has {len(tok)} tokens but the model's vocab_size is "
                                f"{cfg.vocab_size}; expected the tokenizer the model was trained with")
    config = hf_config(cfg, token_ids, train_seq_length, run_name)
    hf_state = to_hf_state_dict(state, cfg)
    if is_native(cfg):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        from megatron_loop.hf.modeling_looplm import LoopLMForCausalLM  # transformers, as above
        with torch.device("meta"):
            model = LoopLMForCausalLM(config)
    missing, unexpected = model.load_state_dict(hf_state, strict=False, assign=True)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise LoopDataError(f"export of {cfg.layout}: tensors missing {missing[:3]} / unexpected "
                            f"{unexpected[:3]} for {type(model).__name__}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = GenerationConfig(**token_ids)

    tmp = staging_folder(output)
    try:
        model.save_pretrained(tmp, max_shard_size=max_shard_size)
        if tok is not None:
            tok.save_pretrained(tmp)
        _write_readme(tmp, cfg, with_tokenizer=tok is not None)
        write_export_record(tmp)
    except Exception as e:  # a full disk or a file-size limit (safetensors raises SafetensorError)
        why = write_failure(e, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, OSError) and "os error" not in str(e) and "EFBIG" not in why:
            raise
        kept = f"; the previous export in {output} is kept" if output.exists() else ""
        raise LoopDataError(f"{output}: writing the export failed ({why}); nothing was published{kept}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if output.is_dir() and any(output.iterdir()):
        try:  # again: the folder may have changed while the export was written
            check_replaceable(output)
        except LoopDataError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return publish_folder(tmp, output)


def _write_readme(folder: Path, cfg: ModelConfig, with_tokenizer: bool = True) -> None:
    native = is_native(cfg)
    kind = "native" if native else "looplm (trust_remote_code=True)"
    model_line = "model = AutoModelForCausalLM.from_pretrained(PATH" + (
        ")" if native else f", trust_remote_code=True, num_loops={cfg.train_loops})")
    # AutoTokenizer reads config.json first: with the model's code trusted (as the model line trusts it) it
    # neither asks whether to run it nor notes that it read a looplm config as a generic one.
    tok_line = ("tokenizer = AutoTokenizer.from_pretrained(PATH)" if native else
                "tokenizer = AutoTokenizer.from_pretrained(PATH, trust_remote_code=True)")
    imports = "AutoModelForCausalLM, AutoTokenizer" if with_tokenizer else "AutoModelForCausalLM"
    (folder / "README.md").write_text(
        f"# LoopLM {cfg.layout}\n\nExported by megatron_loop ({kind}). Effective depth at r loops: "
        f"L(r) = {cfg.prelude_layers} + r*{cfg.core_layers} + {cfg.coda_layers}; trained with r = K = "
        f"{cfg.train_loops}.\n\n```python\nfrom transformers import {imports}\n{model_line}\n"
        + (f"{tok_line}\n" if with_tokenizer else "") + "```\n")


def check_tokenizer_identity(tokenizer: str | None, chosen) -> None:
    """Refuse a tokenizer folder whose files differ from those the checkpoint's run trained with
    (recorded in its manifest): a folder retrained in place would export another vocabulary."""
    recorded = (chosen.manifest or {}).get("tokenizer") or {}
    now = tokenizer_fingerprint(tokenizer) or {}
    if recorded.get("sha256") and now.get("sha256") and recorded["sha256"] != now["sha256"]:
        raise LoopDataError(f"{tokenizer}: not the tokenizer the model was trained with: the sha256 of its files is "
                            f"{now['sha256'][:12]}, {chosen.path / MANIFEST} records {recorded['sha256'][:12]} "
                            f"({recorded.get('name')}); pass --tokenizer with the tokenizer of training")


def convert_checkpoint(ckpt_dir: str | os.PathLike, output: str | os.PathLike, tag: str | None = None,
                       tokenizer: str | None = None, overwrite: bool = False,
                       max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE) -> Path:
    """DeepSpeed checkpoint folder (a run's ``checkpoints/`` or one ``global_step*`` in it; any
    ZeRO stage) -> HF folder. The checkpoint is chosen and verified as training resumes: ``tag``
    (or a tag folder) must verify, otherwise ``latest`` with fallback to the newest complete
    checkpoint. The tokenizer defaults to the run config's ``data.tokenizer``."""
    output = Path(output)
    with ExportLock(output):  # also the writability check of the output's folder, before the slow work
        return _convert_checkpoint(Path(ckpt_dir), output, tag, tokenizer, overwrite, max_shard_size)


def _convert_checkpoint(ckpt_dir: Path, output: Path, tag: str | None, tokenizer: str | None, overwrite: bool,
                        max_shard_size: str | int) -> Path:
    _prepare_output(output, overwrite)  # fail before the (slow) consolidation
    chosen = select_checkpoint(ckpt_dir, tag)
    cfg = load_run_config(chosen.root)
    check_shard_size(max_shard_size, cfg.model)
    source = None if tokenizer else f"{chosen.root / CONFIG_NAME}: data.tokenizer={cfg.data.tokenizer!r}"
    tokenizer = tokenizer or cfg.data.tokenizer
    _load_tokenizer(tokenizer, source)  # a bad tokenizer fails here, before the (slow) consolidation
    check_tokenizer_identity(tokenizer, chosen)
    report_selection(chosen)
    chosen, state = read_weights_or_newest(chosen, ckpt_dir, tag)  # a live run's retention may remove it mid-read
    return _export_state_dict(state, cfg.model, output, tokenizer, overwrite, max_shard_size, source,
                              cfg.train.seq_length, recorded_run_name(chosen.root))


def check_shard_size(max_shard_size: str | int, cfg: ModelConfig) -> None:
    """A shard holds whole tensors: below the largest one (fp32, as exported) every tensor becomes a shard of
    its own (``--max-shard-size 1`` wrote 21 one-tensor files), a unit left out rather than a layout."""
    from transformers.utils.hub import convert_file_size_to_int

    size = max_shard_size if isinstance(max_shard_size, int) else convert_file_size_to_int(max_shard_size)
    d = cfg.hidden_size
    largest = 4 * d * max(cfg.vocab_size, cfg.intermediate_size, cfg.num_attention_heads * cfg.head_dim, 2 * d)
    if size < largest:
        raise LoopConfigError(f"--max-shard-size {max_shard_size}: {size:,} bytes, below the model's largest tensor "
                              f"({largest:,} bytes in fp32), so every tensor would be a shard of its own; expected "
                              f"at least {largest:,} bytes (e.g. {DEFAULT_MAX_SHARD_SIZE}, the default)")
