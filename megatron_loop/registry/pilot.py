"""The optimizer pilot (App. D.1, Table 7): six architectures, each trained with AdamW and with Muon.

App. D.1 says only "the same pre-training setup", so the backbone, batch, peak lr, sequence
length and budget of these runs are assumptions, named in :data:`PILOT_ASSUMPTIONS` and
:data:`PILOT_BUDGET` and marked in the generated files and in ``--list-configs``.
"""

from __future__ import annotations

from megatron_loop.registry.architectures import NO_CONDITIONING, Conditioning, Run, make_run

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
OURO_NOTE = ("Ouro read as BaseLoop 3x4 without its learned exit gate: App. D.1 names 'Ouro (3x4)' and "
             "'the same pre-training setup' only, and says nothing of the gate; Ouro's exit gate, trained with an "
             "entropy-regularised objective (Zhu et al. 2025), is not implemented in this stack, so this config "
             "trains the same model as pilot_baseloop_3x4 under its own name")
PILOT_OPTIMIZERS = (("adamw", "adamw"), ("muon_adamw", "muon"))  # (train.optimizer, file-name tag)


def pilot_runs() -> list[Run]:
    """The optimizer pilot (App. D.1, Table 7), AdamW vs Muon. LoopFormer is read as BaseLoop +
    AdaLN (Sec. 5.2: AdaLN "adopts LoopFormer's modulation structure"), Huginn as CoreLoop +
    dense initial injection (Sec. 5.1: "Huginn implements I_phi by concatenating h and h0
    followed by a linear projection"), Ouro as BaseLoop 3x4 without its exit gate (OURO_NOTE)."""
    architectures = [
        ("nonloop_12x1", (0, 12, 1, 0), NO_CONDITIONING, ""),
        ("nonloop_3x1", (0, 3, 1, 0), NO_CONDITIONING, ""),
        ("baseloop_3x4", (0, 3, 4, 0), NO_CONDITIONING, ""),
        ("loopformer_3x4", (0, 3, 4, 0), Conditioning(timestep="adaln"), "LoopFormer read as BaseLoop + AdaLN"),
        ("ouro_3x4", (0, 3, 4, 0), NO_CONDITIONING, OURO_NOTE),
        ("huginn_1+2x5+1", (1, 2, 5, 1), Conditioning(initial="dense"),
         "Huginn read as CoreLoop + dense initial injection (without its sampled loop counts)"),
    ]
    runs = []
    for architecture, layout, conditioning, note in architectures:
        for optimizer, tag in PILOT_OPTIMIZERS:
            runs.append(make_run("qwen", layout, conditioning, name=f"pilot_{architecture}_{tag}",
                                 train=(("optimizer", optimizer), ("train_tokens", None)),
                                 note="; ".join(x for x in (PILOT_NOTE, note) if x)))
    return runs


def is_pilot(run: Run) -> bool:
    """A run of the optimizer pilot (App. D.1), whose recipe values are assumptions."""
    return run.name.startswith("pilot_")
