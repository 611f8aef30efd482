"""The project's own error types: every failure on bad input is one of these, with a message
that names the file, line, key or field at fault."""


class MlxioError(Exception):
    """Base of every error the project raises on bad input."""


class ConfigError(MlxioError, ValueError):
    """A config key, value or override is wrong (the message names the key)."""


class DataError(MlxioError, ValueError):
    """A data file is malformed (the message names file:line and field)."""


class LoadError(MlxioError, ValueError):
    """A weights / model file is unreadable, corrupt or unsafe (the message names the file/key)."""


class CheckpointError(MlxioError):
    """A checkpoint is corrupt, incomplete or from another run (the message names why)."""


class TrainingDiverged(MlxioError):
    """Too many optimizer steps in a row had a non-finite loss or gradient (the message says
    which step, how many, and what to try)."""
