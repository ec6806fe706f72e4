"""The ``parallel:`` config section: Megatron-style tensor parallelism (TP) and sequence parallelism (SP).

``tensor_model_parallel_size`` N splits every block's attention heads, query groups and MLP
columns, and the vocabulary of the embedding and LM head, over N ranks (megatron-core's TP
layers); the remaining ``world_size / N`` ranks are data parallel. ``sequence_parallel`` also
splits the activations between the TP layers (norms, residual stream, conditioning) along the
sequence (megatron-core's sequence parallelism). docs/PARALLELISM.md has the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_loop.errors import LoopConfigError


@dataclass
class ParallelConfig:
    # Ranks that share one copy of the model, each holding 1/N of every matrix (TP groups lie
    # inside a node: consecutive ranks). 1: no tensor parallelism.
    tensor_model_parallel_size: int = 1
    # Also split the activations outside the TP matmuls along the sequence over the TP group
    # (all-reduce -> reduce-scatter + all-gather); needs tensor_model_parallel_size > 1.
    sequence_parallel: bool = False

    def validate(self, prefix: str = "parallel") -> None:
        if self.tensor_model_parallel_size < 1:
            raise LoopConfigError(f"{prefix}.tensor_model_parallel_size={self.tensor_model_parallel_size}: "
                                  "expected an integer >= 1")
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise LoopConfigError(f"{prefix}.sequence_parallel=true: expected "
                                  f"{prefix}.tensor_model_parallel_size > 1 (sequence parallelism splits "
                                  "activations over the tensor-parallel group)")

    def check_model(self, model, prefix: str = "parallel") -> None:
        """Every split dimension of ``model`` (a ModelConfig) must divide by N (no vocabulary padding:
        the HF export keeps ``vocab_size`` as trained)."""
        n = self.tensor_model_parallel_size
        if n == 1:
            return
        for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
            value = getattr(model, key)
            if value % n:
                raise LoopConfigError(f"{prefix}.tensor_model_parallel_size={n}: expected a divisor of "
                                      f"model.{key}={value} (each tensor-parallel rank holds 1/{n} of it)")

    def check_world(self, world_size: int, seq_length: int | None = None, prefix: str = "parallel") -> int:
        """The data-parallel size ``world_size / N``; an error when N does not divide the world (or, with
        sequence parallelism, the sequence length)."""
        n = self.tensor_model_parallel_size
        if world_size % n:
            raise LoopConfigError(f"{prefix}.tensor_model_parallel_size={n}: expected a divisor of the world size "
                                  f"{world_size} (ranks = tensor-parallel x data-parallel)")
        if self.sequence_parallel and seq_length is not None and seq_length % n:
            raise LoopConfigError(f"{prefix}.sequence_parallel=true: expected train.seq_length={seq_length} to be "
                                  f"a multiple of {prefix}.tensor_model_parallel_size={n}")
        return world_size // n
