"""Project exceptions. CLIs catch them and print one ``error: ...`` line, exit code 2."""


class LoopConfigError(ValueError):
    """A configuration value (YAML key, CLI override, model field) is invalid."""


class LoopDataError(ValueError):
    """Input data (corpus, indexed prefix, tokenizer, checkpoint) is missing or malformed."""
