"""The error every layer raises for a model that cannot be loaded or served as configured."""


class ModelLoadError(Exception):
    """A model that cannot be loaded; the message is one line a person can act on."""
