"""Exceptions raised for bad input. The CLI prints them without a traceback."""


class VlmatchError(Exception):
    """Base class of every error vlmatch raises on purpose."""


class DataError(VlmatchError):
    """Input data (features, captions, score matrices, configs) is missing or malformed.

    The message always names the file and what is wrong with it.
    """

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ConfigError(VlmatchError):
    """A configuration value is unknown or out of range."""
