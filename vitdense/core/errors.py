"""Errors of the user's making that the command line reports in one line, not a traceback."""


class DataError(ValueError):
    """A dataset that cannot be used as configured: a missing or unpaired file, an empty
    class, an out-of-range label, too few images for a batch. The message names the file
    or setting and the fix."""


class ConfigError(ValueError):
    """A setting that cannot work as given: an unknown model name, an argument timm does not
    take, a list whose length does not match the classes. The message names the setting
    and the fix."""


class NonFiniteError(ValueError):
    """A model output that is NaN or infinite where a number is needed (training diverged or
    overflowed). The message names the image and the query, and the fix.

    Attributes:
        image: the image's position in its batch.
        query: the query's index among the image's predictions.
    """

    def __init__(self, message: str, image: int, query: int) -> None:
        super().__init__(message)
        self.image = image
        self.query = query


class CheckpointError(ValueError):
    """A weight or checkpoint file that cannot be used: missing, unreadable, not a checkpoint,
    or weights that do not fit the architecture (the message lists the keys that do not fit)."""


class NoTaskError(CheckpointError):
    """Weights without the task they belong to: a plain weight file, or a Lightning checkpoint
    that does not name its task's class (saved from Python by an older vitdense, or by a task
    class defined in a script). The message says how to use them.

    Attributes:
        lightning: the file is a Lightning checkpoint (state_dict and hyper_parameters), so
            `TheTask.load_from_checkpoint(path)` loads it.
    """

    def __init__(self, message: str, lightning: bool) -> None:
        super().__init__(message)
        self.lightning = lightning
