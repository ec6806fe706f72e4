"""Every rank runs the config rank 0 runs, on the same data and tokenizer, or the job does not start.

Each rank reads its own YAML (``training/setup.py``): a node with an edited copy, a ``--set`` given
to one rank, or another file at the same path made ranks with different learning rates, sequence
lengths, ZeRO stages or loop counts train together silently (a ZeRO-1 rank and a ZeRO-2 rank
published a checkpoint as "stage 1"), or crash deep inside a collective (``core_layers``: SIGABRT
in gloo on one rank, "another rank exited" on the other). Right after the world is formed, before
anything else is built, every rank compares its :func:`run_fingerprint` with rank 0's (one
broadcast, one all-gather) and every rank stops with the same line naming the first key that
differs and the ranks that differ.
"""

from __future__ import annotations

import json
from typing import Any

from megatron_loop.config import Config
from megatron_loop.config.deepspeed import DeepSpeedSettings
from megatron_loop.errors import LoopConfigError
from megatron_loop.training import distributed as D
from megatron_loop.training.distributed import DistInfo
from megatron_loop.training.resume import data_fingerprint
from megatron_loop.data.tokenizer import tokenizer_fingerprint


def run_fingerprint(cfg: Config, deepspeed: DeepSpeedSettings | None) -> dict[str, Any]:
    """What a rank runs, key by key: the resolved config, the DeepSpeed JSON's contents (the same path
    may hold another file on another node), and the training data and tokenizer as the resume check
    sees them (size and sampled content hash of each prefix, the sha256 of the tokenizer's files)."""
    flat = {f"{section}.{key}": value for section, values in cfg.to_dict().items() for key, value in values.items()}
    if deepspeed is not None:  # as this rank read it, once (config/deepspeed.py)
        flat[f"the contents of train.deepspeed_config={deepspeed.path!r}"] = deepspeed.raw
    for i, data in enumerate(data_fingerprint(cfg)):
        flat[f"data.train_prefixes[{i}] (size and sampled content of {data['prefix']})"] = \
            [data["bytes"], data["content_sha256"]]
    flat[f"data.tokenizer={cfg.data.tokenizer!r} (sha256 of its files)"] = \
        (tokenizer_fingerprint(cfg.data.tokenizer) or {}).get("sha256")
    return flat


def _show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def first_difference(reference: dict[str, Any], mine: dict[str, Any]) -> tuple[str, Any] | None:
    """(key, this rank's value) of the first key where ``mine`` differs from rank 0's ``reference``."""
    for key in [*reference, *(k for k in mine if k not in reference)]:
        if key not in mine or key not in reference or mine[key] != reference[key]:
            return key, mine.get(key, "(missing)")
    return None


def check_ranks_agree(cfg: Config, deepspeed: DeepSpeedSettings | None, info: DistInfo) -> None:
    """Refuse (every rank, the same :class:`LoopConfigError`) a job whose ranks run different configs,
    data or tokenizers: ``error: the ranks run different settings: KEY=A on rank 0, B on rank 1; ...``."""
    if info.world_size == 1:
        return
    mine = run_fingerprint(cfg, deepspeed)
    reference = D.broadcast_object(mine if info.is_main else None)
    found = first_difference(reference, mine)
    report = D.all_gather_object(None if found is None else (found[0], _show(found[1])))
    differing = [(rank, item) for rank, item in enumerate(report) if item is not None]
    if not differing:
        return
    key = differing[0][1][0]
    values: dict[str, list[int]] = {}
    for rank, (k, value) in differing:
        if k == key:
            values.setdefault(value, []).append(rank)
    others = "; ".join(f"{value} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
                       for value, ranks in values.items())
    more = sorted({rank for rank, (k, _) in differing if k != key})
    also = f" (ranks {', '.join(map(str, more))} differ first in other keys)" if more else ""
    raise LoopConfigError(f"the ranks run different settings: {key}={_show(reference.get(key, '(missing)'))} on "
                          f"rank 0, {others}{also}; expected every rank to run the same config, DeepSpeed JSON, data "
                          "and tokenizer (the same YAML, --set overrides and files on every node)")
