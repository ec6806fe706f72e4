"""The on-disk checkpoint format: what a checkpoint folder holds, how it is written, verified,
chosen and read back. Training writes through it (:mod:`megatron_loop.training.checkpoint` drives
DeepSpeed's engine across ranks); the HF export, the probes and the evaluation read through it.

Checkpoint folder contract::

    CKPT_DIR/latest                 tag of the newest published checkpoint (DeepSpeed's convention)
    CKPT_DIR/looplm_config.json     the resolved run config (``Config.to_dict()``; a ``relocation`` block
                                    spells its paths inside the run's folder relative to it, a ``run``
                                    block names the run as training did: folders.py)
    CKPT_DIR/global_step{N}/        DeepSpeed shards + rng_state_rank{r}.pt + manifest.json
    CKPT_DIR/global_step{N}.partial a save in progress (never read)
    CKPT_DIR/set_aside/...          checkpoints of an abandoned branch or that failed verification

``manifest.json`` lists the size and sha256 of every file of its checkpoint, the step and the
settings of the run that wrote it. A save writes everything under ``<tag>.partial``, then the
manifest, renames the folder to ``<tag>`` and only then replaces ``latest`` (temp file +
``os.replace``): a crash at any point leaves the previous checkpoint published and loadable.

Modules, by job:

* ``folders``: the names (tags, ``latest``, ``.partial``, ``set_aside``), the run config file;
* ``manifest``: writing and verifying ``manifest.json``, the architecture a checkpoint belongs to;
* ``selection``: which checkpoint a resume, an export or a probe reads (``latest`` verified,
  falling back to the newest older one that verifies);
* ``publish``: the rename that publishes a save, retention, adopting another folder's checkpoint;
* ``state``: the loop counters and RNG states a checkpoint carries for an exact resume;
* ``weights``: weights-only unpickling and the consolidated fp32 weights (any ZeRO stage);
* ``universal``: DeepSpeed's universal layout, to resume on another number of data-parallel ranks.
"""
