"""``parallel/per_rank.py``: what one rank of a TP x DP run holds, computes and sends (``--dry-run``): the TP
traffic model counted by hand, parameters per rank from the sharded ones, and the dry run's keys."""

from __future__ import annotations

from megatron_loop.config import build_model_config, config_from_dict
from megatron_loop.parallel.per_rank import parameters_per_rank, sharded_parameters, tensor_parallel_figures
from megatron_loop.plan import count_parameters


def test_tp_traffic_model_counts_the_embedding_and_head_alike_with_sequence_parallelism():
    """Per block occurrence 8 (t-1)/t S without SP, 10 with (megatron-core re-gathers the column-parallel
    inputs in backward); embedding + head input 4 (t-1)/t S either way (with SP the embedding's
    reduce-scatter has an all-gather in backward, the head's all-gather a reduce-scatter)."""
    from megatron_loop.parallel.per_rank import tp_communication_bytes

    cfg = build_model_config(dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, train_loops=3, coda_layers=1))
    t, b, s, w = 4, 2, 16, 2
    S = b * s * cfg.hidden_size * w
    share = (t - 1) / t
    loss = 2 * share * 3 * 4 * b * s
    assert tp_communication_bytes(cfg, t, False, b, s, w) == int(8 * 8 * share * S + 4 * share * S + loss)
    assert tp_communication_bytes(cfg, t, True, b, s, w) == int(8 * 10 * share * S + 4 * share * S + loss)
    assert tp_communication_bytes(cfg, 1, True, b, s, w) == 0


def test_parameters_per_rank_split_the_vocabulary_rows_and_block_matrices_only():
    cfg = build_model_config(dict(backbone="tiny-llama", prelude_layers=1, core_layers=2, train_loops=3,
                                  coda_layers=1, history_injection="dense"))
    total = count_parameters(cfg).total
    d, v, f = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    qkv = d * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    per_block = qkv + cfg.num_attention_heads * cfg.head_dim * d + 3 * d * f
    assert sharded_parameters(cfg) == 2 * v * d + 4 * per_block  # embedding + untied head, 4 physical blocks
    assert parameters_per_rank(cfg, total, 1) == total
    assert parameters_per_rank(cfg, total, 4) == total - sharded_parameters(cfg) + sharded_parameters(cfg) // 4


def test_the_dry_run_keys_name_the_grid_and_add_memory_and_traffic_only_above_tp_1():
    def cfg(tp):
        return config_from_dict({"model": {"backbone": "tiny-llama"}, "train": {"seq_length": 32, "global_batch_size": 8,
                                 "micro_batch_size": 2, "precision": "fp32"},
                                 "parallel": {"tensor_model_parallel_size": tp}})

    one = tensor_parallel_figures(cfg(1), 1000, 4)
    assert (one["parallel_layout"], one["world_size"], one["params_per_rank"]) == ("TP 1 x DP 4", 4, 1000)
    assert "tp_comm_bytes_per_micro_batch" not in one
    two = tensor_parallel_figures(cfg(2), count_parameters(cfg(2).model).total, 4)
    assert (two["parallel_layout"], two["world_size"]) == ("TP 2 x DP 4", 8)
    assert two["activation_bytes_per_rank"] < two["activation_bytes_tp1"] and two["tp_comm_bytes_per_micro_batch"] > 0
