"""``registry/recipes.py``: the two families' recipes agree with the arithmetic their notes state (App. C.1,
C.2, Tables 1 and 3), and the execution settings split each global batch evenly (the rendered configs:
tests/unit/registry/test_registry.py)."""

from __future__ import annotations

import re

from megatron_loop.config import BACKBONES
from megatron_loop.registry.recipes import DATA_PARALLEL, EXECUTION, FAMILIES, TOY_TRAIN

SEQ = 2048  # the paper's sequence length for both families (App. C.2)


def _numbers(text: str) -> list[int]:
    return [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", text)]


def test_token_budgets_follow_their_notes():
    llama, qwen = FAMILIES["llama"], FAMILIES["qwen"]
    assert llama.train_tokens == 20 * 1_007_482_368  # 20 tokens per parameter of the NonLoop reference
    assert llama.train_tokens // (llama.global_batch_size * SEQ) == 5_394
    assert qwen.train_tokens == 2_860 * qwen.global_batch_size * SEQ
    for family, updates in ((llama, 5_394), (qwen, 2_860)):
        w, s, d = _numbers(family.tokens_note.split("W/S/D ")[1])[:3]
        assert w + s + d == updates, family.key


def test_global_batches_split_over_the_paper_ranks():
    for key, family in FAMILIES.items():
        micro = EXECUTION[key]["micro_batch_size"]
        assert family.global_batch_size % (micro * DATA_PARALLEL) == 0, key
    assert FAMILIES["llama"].global_batch_size // (38 * DATA_PARALLEL) == 6  # 38 x 6 x 8 = 1,824
    assert FAMILIES["qwen"].global_batch_size // (32 * DATA_PARALLEL) == 8  # 32 x 8 x 8 = 2,048
    assert TOY_TRAIN["global_batch_size"] % EXECUTION["toy"]["micro_batch_size"] == 0


def test_presets_exist_and_execution_is_only_execution():
    for family in FAMILIES.values():
        assert family.backbone in BACKBONES and family.toy_backbone in BACKBONES
    assert {k for settings in EXECUTION.values() for k in settings} == {"micro_batch_size", "recompute", "compile",
                                                                         "deepspeed_config"}
    assert set(EXECUTION) == {*FAMILIES, "toy"}
