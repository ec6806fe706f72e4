"""Hugging Face export of LoopLMs, above training: a training checkpoint to a transformers folder and back.

* ``convert``       -- the export itself: checkpoint weights -> HF names, config.json, modeling file, safetensors;
* ``output_folder`` -- where an export may be written, one export at a time (``ExportLock``), and what
  ``--overwrite`` may replace;
* ``load``          -- models read back: a LoopLM built plain from a training checkpoint or from an export,
  an export folder checked as ``from_pretrained`` would read it.

The modeling file every export carries is :mod:`megatron_loop.hf.modeling_looplm` (below the model).
"""
