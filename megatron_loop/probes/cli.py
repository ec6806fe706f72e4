"""``tools/probe_geometry.py``: App. C.4 geometry probes of a checkpoint or an HF export.

    python tools/probe_geometry.py --checkpoint runs/qwen_4x7/checkpoints --valid-prefix data/val \
        --loops 7,14,21 --num-sequences 49 --num-positions 100000 --seq-length 2048 --output probe/
    python tools/probe_geometry.py --replot probe/geometry.json --reference-json other/geometry.json \
        --output probe_vs_other/

Writes ``geometry.json`` (every metric, per loop count) and the PNG figures; ``--replot`` redraws
them (and recomputes the summaries and the comparison) from an existing ``geometry.json``.
The sample defaults to the paper's, sized to the run: 49 sequences (fewer, with a note, when the
validation data packs into fewer) of the run's own ``train.seq_length`` (the paper's 2,048; read from
the checkpoint's run config or the export's config.json), exactly 100,000 selected positions (every
position, with a note, when a smaller sample holds fewer). With
``--reference-json`` the sample is checked against the reference's before the model runs: a
comparison needs identical examples (App. C.4), and a mismatch names the setting that differs. Project errors print one ``error: ...`` line and exit 2
(``megatron_loop.cli.run_cli``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from megatron_loop import plotting
from megatron_loop.checkpoint.folders import CONFIG_NAME, recorded_run_name
from megatron_loop.checkpoint.selection import split_checkpoint_path
from megatron_loop.cli import check_output_folder, parse_loop_counts
from megatron_loop.config.validation import MAX_LOOPS
from megatron_loop.console import show_progress
from megatron_loop.data.indexed import check_token_ids
from megatron_loop.errors import LoopConfigError, LoopDataError
from megatron_loop.export.load import load_looplm_from_hf, load_model_from_checkpoint
from megatron_loop.probes.report import JSON_NAME, probe_geometry, read_report, replot
from megatron_loop.probes.runner import ProbeSettings
from megatron_loop.probes.sampling import load_probe_sample, packed_windows
from megatron_loop.probes.summaries import parse_lag_sets

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PAPER_NUM_POSITIONS = 100_000  # App. C.4: "exactly 100,000 selected next-token prediction positions"
PAPER_NUM_SEQUENCES = 49  # App. C.4: 49 sequences of 2,048 tokens hold the 100,000 positions
PAPER_SEQ_LENGTH = 2048


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise LoopConfigError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values:
        raise LoopConfigError(f"{flag}: expected at least one integer")
    return values


def _num_positions(text: str, available: int | None = None) -> int | None:
    """``--num-positions``: an integer, ``all`` for every position of the N sequences (``None``), or
    ``paper`` (the default): the paper's 100,000, or every position when the ``available`` N x (S - 1)
    are fewer (a small validation set; the run says so)."""
    if text == "all":
        return None
    if text == "paper":
        if available is not None and available < PAPER_NUM_POSITIONS:
            print(f"note: --num-positions paper: the sample holds {available:,} positions, fewer than the paper's "
                  f"{PAPER_NUM_POSITIONS:,} (App. C.4); using all of them", file=sys.stderr)
            return None
        return PAPER_NUM_POSITIONS
    try:
        return int(text)
    except ValueError:
        raise LoopConfigError(f"--num-positions {text!r}: expected an integer, 'all' or 'paper'") from None


def _sources(text: str) -> str | list[int]:
    if text in ("all", "beyond_training", "none"):
        return text
    return _int_list(text, "--interaction-sources")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a run's checkpoints/ folder (with looplm_config.json; the checkpoint "
                                          "'latest' names, verified, else the newest complete one) or one "
                                          "global_step* folder in it")
    src.add_argument("--model", help="HF export folder (megatron_loop.export.load.load_looplm_from_hf)")
    src.add_argument("--replot", metavar="GEOMETRY_JSON",
                     help="redraw the figures (and recompute summaries) of an existing geometry.json; no model")
    p.add_argument("--valid-prefix", help="indexed validation prefix (P.bin / P.idx); required unless --replot")
    p.add_argument("--loops", default="1,2,4,8", help="inference loop counts r, comma-separated, increasing")
    p.add_argument("--num-sequences", type=int, default=None,
                   help="packed sequences read (N; default: the paper's 49, or every window the validation data "
                        "holds when fewer)")
    p.add_argument("--num-positions", default="paper",
                   help="selected next-token positions |T|: an integer, 'all' (every position of the N "
                        "sequences) or 'paper' (default: the paper's 100000, or all when the sample holds fewer)")
    p.add_argument("--seq-length", type=int, default=None,
                   help="packed window length in tokens (default: the run's train.seq_length, from the checkpoint's "
                        "run config or the export's config.json; the paper's 2048 where neither records it)")
    p.add_argument("--seed", type=int, default=0, help="document-order seed of the packing")
    p.add_argument("--output", required=True, help="output folder for geometry.json and the figures")
    p.add_argument("--label", default=None, help="the model's name on the figures (default: the run's name as "
                                                 "training recorded it, else NAME of runs/NAME/train/checkpoints)")
    p.add_argument("--interaction-sources", default="all",
                   help="skipped occurrences: all | beyond_training | none | comma-separated positions")
    p.add_argument("--lag-sets", default=None, help="lag sets for C_D, e.g. '1-6,2-6' (default: common range)")
    p.add_argument("--reference-json", default=None,
                   help="another configuration's geometry.json (or its folder): adds percent differences, "
                        "ratios, R(d) and per-block-pair ratios, and the comparison figure")
    p.add_argument("--batch-size", type=int, default=1, help="sequences per forward")
    p.add_argument("--skip-batch", type=int, default=4, help="skip configurations per forward")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="model weights dtype")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--per-r", action="store_true",
                   help="one pass per loop count even where one forward at the largest could serve every one (the "
                        "trajectory does not depend on r: no timestep conditioning, or the prefix grid with r <= K); "
                        "the report is the same, only slower")
    return p


def check_sizes(args: argparse.Namespace, loops: list[int]) -> None:
    """The counts of the command line, before anything is read or loaded (``--batch-size 0`` was refused only
    after the checkpoint had loaded); a count left out (None) comes from the run and the data later."""
    for flag, value, low in (("--batch-size", args.batch_size, 1), ("--skip-batch", args.skip_batch, 1),
                             ("--num-sequences", args.num_sequences, 1), ("--seq-length", args.seq_length, 2),
                             ("--seed", args.seed, 0)):
        if value is not None and value < low:
            raise LoopConfigError(f"{flag} {value}: expected an integer >= {low}")
    if max(loops) > MAX_LOOPS:  # a probe at r runs L(r) block applications per token: --loops 100000 ran for hours
        raise LoopConfigError(f"--loops {max(loops)}: expected loop counts of at most {MAX_LOOPS}")


def _trained_seq_length(checkpoint: str | None, hf_dir: str | None) -> int:
    """The ``train.seq_length`` the model was trained at: the checkpoint's run config or the export's
    ``train_seq_length``; the paper's 2,048, with a note, where neither records it."""
    try:
        if checkpoint is not None:
            root, _ = split_checkpoint_path(Path(checkpoint))
            return int(json.loads((root / CONFIG_NAME).read_text())["train"]["seq_length"])
        return int(json.loads((Path(hf_dir) / "config.json").read_text())["train_seq_length"])
    except (OSError, ValueError, KeyError, TypeError):
        print(f"note: --seq-length: {checkpoint or hf_dir} records no training length; using the paper's "
              f"{PAPER_SEQ_LENGTH}", file=sys.stderr)
        return PAPER_SEQ_LENGTH


def _run_name(checkpoint: str | None, hf_dir: str | None) -> str:
    """The model's name on the figures: what training called the run (its run config, or the export's
    config.json records it), else NAME of runs/NAME/train/checkpoints or runs/NAME/hf."""
    if checkpoint is not None:
        return recorded_run_name(checkpoint)
    try:
        name = json.loads((Path(hf_dir) / "config.json").read_text()).get("run_name")
    except (OSError, ValueError, AttributeError):
        name = None
    return name if isinstance(name, str) and name else plotting.run_name(hf_dir)


def check_source(checkpoint: str | None, hf_dir: str | None) -> None:
    """The model folder exists: checked before the sample is read (cheap errors first)."""
    from megatron_loop.checkpoint.selection import checkpoint_folder_problem

    problem = None if checkpoint is None else checkpoint_folder_problem(Path(checkpoint))
    if problem:
        raise LoopDataError(problem)
    if hf_dir is not None and not Path(hf_dir).is_dir():
        raise LoopDataError(f"--model {hf_dir}: folder not found")


def check_probe_export(hf_dir: str) -> None:
    """``--model``: an export that loads as written (``export.load.check_export``: config.json, complete
    weights whose names and shapes match it) and a LoopLM: a native Llama/Qwen3 has no recurrence
    to probe, and looping its whole stack would be read as a 0+Lx1+0 model run r times."""
    from megatron_loop.export.load import check_export

    config = check_export(hf_dir)
    if config.get("model_type") != "looplm":
        raise LoopDataError(f"--model {hf_dir}: config.json model_type {config.get('model_type')!r} (a plain "
                            f"{', '.join(config.get('architectures') or ['transformers model'])}, no recurrence); "
                            "expected a LoopLM export (model_type 'looplm', written by tools/convert_to_hf.py)")


def load_model(checkpoint: str | None, hf_dir: str | None) -> torch.nn.Module:
    """The LoopLM of a DeepSpeed checkpoint folder or of an HF export."""
    if checkpoint is not None:
        return load_model_from_checkpoint(checkpoint)[0]
    if not Path(hf_dir).is_dir():
        raise LoopDataError(f"--model {hf_dir}: folder not found")
    return load_looplm_from_hf(hf_dir)


def _reference(path: str | None) -> dict | None:
    return None if path is None else read_report(path, "--reference-json")


def check_reference_sample(reference: dict, sample, seq_length: int, path: str) -> None:
    """Refuse, before any model runs, a ``--reference-json`` whose probe sample is not this one
    (App. C.4 compares identical examples and masks), naming the settings that differ."""
    theirs = reference["sampling"]
    if theirs.get("fingerprint") == sample.fingerprint():
        return
    ours = {"num_sequences": sample.num_sequences, "num_positions": sample.num_positions, "seq_length": seq_length}
    flags = {"num_sequences": "--num-sequences", "num_positions": "--num-positions", "seq_length": "--seq-length"}
    differ = [f"{flags[k]} {theirs[k]} there, {ours[k]} here" for k in flags if k in theirs and theirs[k] != ours[k]]
    why = "; ".join(differ) if differ else ("the same sizes on other tokens: --valid-prefix or --seed differ")
    raise LoopConfigError(f"--reference-json {path}: its probe sample differs from this one ({why}); expected "
                          "the same sample (App. C.4 compares identical examples and masks)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    lag_sets = parse_lag_sets(args.lag_sets) if args.lag_sets else None
    reference = _reference(args.reference_json)
    check_output_folder(args.output, "--output", "geometry.json and the figures")
    if args.replot:
        report = replot(args.replot, args.output, lag_sets, reference, args.label)
        print(f"redrew {', '.join(report['files'])} in {args.output} from {args.replot}")
        return 0
    if not args.valid_prefix:
        raise LoopConfigError("--valid-prefix: required with --checkpoint or --model (the probe sample)")
    loops = parse_loop_counts(args.loops)
    check_sizes(args, loops)
    settings = ProbeSettings(loops=loops, sources=_sources(args.interaction_sources), batch_size=args.batch_size,
                             skip_batch=args.skip_batch, progress=show_progress(not args.no_progress),
                             one_pass=not args.per_r)
    check_source(args.checkpoint, args.model)
    if args.model is not None:
        check_probe_export(args.model)
    seq_length = args.seq_length if args.seq_length is not None else _trained_seq_length(args.checkpoint, args.model)
    num_sequences = args.num_sequences
    if num_sequences is None:  # the paper's 49, or what the validation data holds
        num_sequences = min(PAPER_NUM_SEQUENCES, packed_windows(args.valid_prefix, seq_length, args.seed)) or 1
        if num_sequences < PAPER_NUM_SEQUENCES:
            print(f"note: --num-sequences: {args.valid_prefix} packs into {num_sequences} windows of {seq_length} "
                  f"tokens, fewer than the paper's {PAPER_NUM_SEQUENCES} (App. C.4); using all of them", file=sys.stderr)
    num_positions = _num_positions(args.num_positions, num_sequences * (seq_length - 1))
    sample = load_probe_sample(args.valid_prefix, seq_length, num_sequences, num_positions, args.seed)
    if reference is not None:  # before the model runs: a mismatch found after would waste the whole probe
        check_reference_sample(reference, sample, seq_length, args.reference_json)
    model = load_model(args.checkpoint, args.model)
    check_token_ids(args.valid_prefix, model.config.vocab_size)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device=device, dtype=DTYPES[args.dtype])
    report = probe_geometry(model, sample, settings, args.output, lag_sets, reference,
                            args.label or _run_name(args.checkpoint, args.model),
                            on_passes=lambda passes: print(passes.line(), file=sys.stderr))
    print(f"wrote {Path(args.output) / JSON_NAME} and {', '.join(report['files'])} "
          f"(N={report['sampling']['num_sequences']}, |T|={report['sampling']['num_positions']}, "
          f"loops {','.join(report['loops'])})")
    return 0
