"""The self-contained Hugging Face modeling file of LoopLMs (``modeling_looplm.py``, plain torch + transformers):
copied alone into every export and loaded there with ``trust_remote_code``. The training model runs its
recurrence and its conditioning (one implementation). Conversion, output folders and loading are
:mod:`megatron_loop.export`'s."""
