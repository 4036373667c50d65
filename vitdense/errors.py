"""Errors of the user's making that the command line reports in one line, not a traceback."""


class DataError(ValueError):
    """A dataset that cannot be used as configured: a missing or unpaired file, an empty
    class, an out-of-range label, too few images for a batch. The message names the file
    or setting and the fix."""


class ConfigError(ValueError):
    """A setting that cannot work as given: an unknown model name, an argument timm does not
    take, a list whose length does not match the classes. The message names the setting
    and the fix."""


class CheckpointError(ValueError):
    """A weight or checkpoint file that cannot be used: missing, unreadable, not a checkpoint,
    or weights that do not fit the architecture (the message lists the keys that do not fit)."""
