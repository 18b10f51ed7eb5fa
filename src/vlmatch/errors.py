"""Exceptions raised for bad input. The CLI prints them without a traceback."""


class VlmatchError(Exception):
    """Base class of every error vlmatch raises on purpose."""


class DataError(VlmatchError):
    """Input data (features, captions, score matrices, configs) is missing or malformed: the message names the file."""

    def __init__(self, path, problem: str | None = None):
        if problem is None:  # rebuilt from its message: unpickled, or re-raised from a DataLoader worker
            self.path, self.problem = None, _last_line(str(path), type(self).__name__)
            super().__init__(self.problem)
            return
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def _last_line(message: str, name: str) -> str:
    """The original message inside a worker's report ("Caught DataError in DataLoader worker ... Traceback
    ... vlmatch.errors.DataError: path: problem"), or the message itself."""
    lines = message.rstrip().splitlines()
    if len(lines) > 1 and "Traceback" in message:
        last = lines[-1]
        for prefix in (f"vlmatch.errors.{name}: ", f"{name}: "):
            if last.startswith(prefix):
                return last[len(prefix):]
    return message


class ConfigError(VlmatchError):
    """A configuration value is unknown or out of range."""
