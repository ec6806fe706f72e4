"""Per-rank figures of a tensor-parallel x data-parallel run (``--dry-run``, docs/PARALLELISM.md).

With TP size t, sequence parallelism on or off, a micro-batch of b x s tokens, hidden size d and
activations of ``itemsize`` bytes (S = b s d itemsize, one hidden-state tensor):

* parameters per rank: the sharded ones (embedding and LM head rows, every block's QKV, output
  projection and MLP matrices) / t, plus every replicated one (norms, conditioning) whole;
* FLOPs per rank: the model FLOPs of its data-parallel group's tokens / t (the block matmuls
  split evenly). Norms and the scalar / channel-wise conditioning, O(d) per token, are left out as
  in ``flops.py``; dense injection, O(d^2) per token per loop (2 d x 2d initial, 2 d^2 per history
  lag), is in the model FLOPs but not split: it is replicated, so every rank of the group repeats
  it, and the figure here (model FLOPs / t) leaves out that redundant (t - 1)/t of it (1-6 % of a
  step's FLOPs on the paper's dense runs);
* TP communication per rank per micro-batch, ring collectives moving (t-1)/t of their buffer per
  rank (an all-reduce twice that): per block occurrence -- and a looped core has L(K) = p + K c_s
  + c of them, so the shared core pays its collectives K times --

      without SP: forward 2 all-reduces (attention and MLP outputs), backward 2 (the inputs of
                  the column-parallel QKV and fc1):           4 x 2 (t-1)/t S = 8 (t-1)/t S
      with SP:    forward 2 all-gathers + 2 reduce-scatters, backward 2 reduce-scatters + 4
                  all-gathers:                                             10 (t-1)/t S

  The 10 is this implementation's count, not Korthikanti et al.'s 8 (2022, sequence parallelism
  moving the same bytes as the all-reduces it replaces): megatron-core's column-parallel linear
  all-gathers its sequence-sharded input again in backward for the weight gradient instead of
  keeping the gathered copy, 2 more all-gathers per block. Plus, once per micro-batch, the
  embedding and the head input, 4 (t-1)/t S with or without SP: without SP the embedding's
  forward all-reduce and the head input's backward all-reduce; with SP the embedding's forward
  reduce-scatter and its backward all-gather, the head input's forward all-gather and its
  backward reduce-scatter; and the loss statistics (3 fp32 numbers per token: 12 b s bytes per
  chunk pass, independent of d and V).
  Activation recomputation repeats the forward collectives of every recomputed block.
* activation memory per rank: the per-block model of ``model/recompute.py`` with the heads,
  query groups and MLP columns divided by t; the hidden-sized tensors (norm inputs and outputs,
  residual stream) are whole on every rank without SP and 1/t with it.
"""

from __future__ import annotations

import dataclasses

from megatron_loop.config import ModelConfig
from megatron_loop.flops import block_matmul_params, train_flops_per_token


def sharded_parameters(cfg: ModelConfig) -> int:
    """Parameters split over the TP group: vocabulary rows (embedding, untied head) and block matrices."""
    return cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2) \
        + cfg.physical_depth * block_matmul_params(cfg)


def parameters_per_rank(cfg: ModelConfig, total: int, tp: int) -> int:
    """Parameters one TP rank holds, from the model's ``total`` (``plan.count_parameters``)."""
    sharded = sharded_parameters(cfg)
    return total - sharded + sharded // tp


def tp_communication_bytes(cfg: ModelConfig, tp: int, sequence_parallel: bool, micro_batch: int, seq_length: int,
                           itemsize: int, num_loops: int | None = None) -> int:
    """Bytes one rank sends over its TP group for one micro-batch (forward + backward, no
    recomputation), by the count of the module docstring."""
    if tp == 1:
        return 0
    hidden = micro_batch * seq_length * cfg.hidden_size * itemsize  # S
    share = (tp - 1) / tp
    per_block = (10 if sequence_parallel else 8) * share * hidden
    # embedding (forward all-reduce; SP: forward reduce-scatter + backward all-gather), head input
    # (backward all-reduce; SP: forward all-gather + backward reduce-scatter): 4 (t-1)/t S either way;
    # loss statistics: max, sum-exp and target logit per token (fp32 all-reduces)
    edges = 4 * share * hidden
    loss = 2 * share * 3 * 4 * micro_batch * seq_length
    return int(cfg.effective_depth(num_loops) * per_block + edges + loss)


def activation_bytes_per_rank(cfg: ModelConfig, tp: int, sequence_parallel: bool, micro_batch: int,
                              seq_length: int, itemsize: int, num_loops: int | None = None) -> int:
    """Activation bytes one rank keeps for backward for one micro-batch without recomputation: every
    block occurrence of L(K) (``model.recompute.block_bytes_per_token`` per rank)."""
    from megatron_loop.model.recompute import block_bytes_per_token  # torch: only for TP plans

    local = dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // tp,
                                num_key_value_heads=cfg.num_key_value_heads // tp,
                                intermediate_size=cfg.intermediate_size // tp)
    per_token = block_bytes_per_token(local, micro_batch, itemsize)[0]
    if sequence_parallel:  # the hidden-sized tensors are sequence shards too
        hidden_only = dataclasses.replace(cfg, num_attention_heads=0, num_key_value_heads=0, intermediate_size=0,
                                          head_dim=0, qk_norm=False)
        per_token -= (1 - 1 / tp) * block_bytes_per_token(hidden_only, micro_batch, itemsize)[0]
    return int(cfg.effective_depth(num_loops) * per_token * micro_batch * seq_length)


def tensor_parallel_figures(cfg, params: int, data_parallel_size: int) -> dict:
    """The dry run's tensor-parallel keys for a Config: the layout, the per-rank parameters and model
    FLOPs of a step and, with TP > 1, the per-rank activation memory and TP traffic of one
    micro-batch (precision: bf16 unless fp32)."""
    p, t, m = cfg.parallel, cfg.train, cfg.model
    tp = p.tensor_model_parallel_size
    world = tp * data_parallel_size
    figures = dict(tensor_parallel_size=tp, sequence_parallel=p.sequence_parallel, world_size=world,
                parallel_layout=f"TP {tp} x DP {data_parallel_size}", params_per_rank=parameters_per_rank(m, params, tp),
                # model FLOPs of one optimizer step shared by every GPU (each TP rank does 1/t of its group's)
                train_flops_per_rank_per_step=train_flops_per_token(m, t.seq_length) * t.global_batch_size
                * t.seq_length / world)
    if tp > 1:
        itemsize = 4 if t.precision == "fp32" else 2
        args = (t.micro_batch_size, t.seq_length, itemsize)
        figures.update(activation_bytes_per_rank=activation_bytes_per_rank(m, tp, p.sequence_parallel, *args),
                    activation_bytes_tp1=activation_bytes_per_rank(m, 1, False, *args),
                    tp_comm_bytes_per_micro_batch=tp_communication_bytes(m, tp, p.sequence_parallel, *args))
    return figures
