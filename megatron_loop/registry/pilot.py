"""The optimizer pilot (App. D.1, Table 7): six architectures, each trained with AdamW and with Muon.

App. D.1 says only "the same pre-training setup", so the backbone, batch, peak lr, sequence
length and budget of these runs are assumptions, named in :data:`PILOT_ASSUMPTIONS` and
:data:`PILOT_BUDGET` and marked in the generated files and in ``--list-configs``.
"""

from __future__ import annotations

from megatron_loop.registry.architectures import NO_CONDITIONING, Conditioning, Run, make_run

# Table 7's columns, in its order (``--tasks`` of the pilot's loop sweep; each a task of eval/tasks.py).
PILOT_SUITE = ("arc_easy", "arc_challenge", "sciq", "mmlu", "hellaswag", "openbookqa", "piqa", "race", "winogrande",
               "commonsense_qa")
PILOT_NOTE = ("App. D.1 names neither backbone nor budget for the pilot: Qwen3-0.6B widths and recipe with "
              "the Chinchilla budget of the L(K)-layer NonLoop are assumed")
# The pilot's recipe values that App. D.1 does not give ("the same pre-training setup" only): what
# the generated files assume, marked in their comments and in --list-configs.
PILOT_ASSUMPTIONS: dict[tuple[str, str], str] = {
    ("model", "backbone"): "assumed (App. D.1 names no backbone): Qwen3-0.6B widths",
    ("train", "global_batch_size"): "assumed: the Qwen recipe's batch (App. C.2)",
    ("train", "lr"): "assumed: the Qwen peak lr (Table 3) for AdamW and Muon alike",
    ("train", "seq_length"): "assumed: the main runs' 2,048",
    ("train", "optimizer"): "the pilot's variable (App. D.1, Table 7)",
}
PILOT_BUDGET = ("train_tokens unset = 20 tokens per parameter of the run's L(K)-layer NonLoop "
                "(train.tokens_per_parameter)")
OURO_NOTE = ("Ouro (Zhu et al. 2025) as BaseLoop 3x4 with its learned exit gate trained by the entropy-regularised "
             "Stage I objective (beta = 0.1; model/exit_gate.py): App. D.1 names 'Ouro (3x4)' and 'the same "
             "pre-training setup' only, so the stack's pre-norm blocks are kept (Ouro's own block also normalises "
             "each branch output and the state between loops)")
LOOPFORMER_NOTE = ("LoopFormer (Jeddi et al., ICLR 2026) as BaseLoop 3x4 with its shortcut modulation on (t, dt) "
                   "(model.timestep: shortcut) and its shortcut-consistency training on variable-length trajectories "
                   "(train.shortcut_consistency, weights 0.1 and 0.1; model/shortcut.py); the stack's Qwen3 blocks "
                   "are kept, their RMSNorm weights included (LoopFormer's modulated norms have none)")
HUGINN_NOTE = ("Huginn (Geiping et al. 2025) as CoreLoop 1+2x5+1 with its sandwich-normalised blocks, the final norm on "
               "the recurrent output before the Coda, the recurrent state drawn from TruncNormal(0, 2/5) noise with the "
               "Prelude output injected at every loop by its adapter (dense injection, Huginn's initialisation; "
               "model/initial_state.py), and its Poisson-log-normal loop counts with mean K = 5 (Huginn's mean "
               "recurrence 4, plus one) and truncated backpropagation through the last 2 loops (Huginn's 8 of 33 "
               "scaled to K, rounded up: an assumption); the stack's Qwen3 backbone is kept (Huginn's embedding scale "
               "sqrt(d), takase initialisation and QK bias are not)")
PILOT_OPTIMIZERS = (("adamw", "adamw"), ("muon_adamw", "muon"))  # (train.optimizer, file-name tag)


# A peer design is the paper's layout and conditioning plus its own keys: make_run(..., model=(("key", value),
# ...)) for model.* keys (Run.model) and train=(...) for the train.* keys of its objective (Run.train).


def pilot_runs() -> list[Run]:
    """The optimizer pilot (App. D.1, Table 7), AdamW vs Muon. LoopFormer as its paper and code define it
    (LOOPFORMER_NOTE), Huginn as its paper and code define it
    (HUGINN_NOTE; Sec. 5.1 of the paper: "Huginn implements I_phi by concatenating h and h0 followed by
    a linear projection"), Ouro as BaseLoop 3x4 with its learned exit gate and Stage I
    objective (OURO_NOTE)."""
    # (name, layout, conditioning, the design's model.* keys, the design's train.* keys, note)
    architectures = [
        ("nonloop_12x1", (0, 12, 1, 0), NO_CONDITIONING, (), (), ""),
        ("nonloop_3x1", (0, 3, 1, 0), NO_CONDITIONING, (), (), ""),
        ("baseloop_3x4", (0, 3, 4, 0), NO_CONDITIONING, (), (), ""),
        ("loopformer_3x4", (0, 3, 4, 0), Conditioning(timestep="shortcut"), (), (("shortcut_consistency", True),),
         LOOPFORMER_NOTE),
        ("ouro_3x4", (0, 3, 4, 0), NO_CONDITIONING, (("exit_gate", "learned"),),
         (("exit_gate_objective", "entropy_regularized"), ("exit_entropy_beta", 0.1)), OURO_NOTE),
        ("huginn_1+2x5+1", (1, 2, 5, 1), Conditioning(initial="dense"),
         (("block_norm", "sandwich"), ("norm_core_output", True), ("initial_state", "noise")),
         (("loop_sampling", "poisson_lognormal"), ("backprop_loops", 2)), HUGINN_NOTE),
    ]
    runs = []
    for architecture, layout, conditioning, model, design_train, note in architectures:
        for optimizer, tag in PILOT_OPTIMIZERS:
            runs.append(make_run("qwen", layout, conditioning, name=f"pilot_{architecture}_{tag}", model=model,
                                 train=(("optimizer", optimizer), ("train_tokens", None), *design_train),
                                 note="; ".join(x for x in (PILOT_NOTE, note) if x)))
    return runs


def is_pilot(run: Run) -> bool:
    """A run of the optimizer pilot (App. D.1), whose recipe values are assumptions."""
    return run.name.startswith("pilot_")
