"""Errors of the user's making that the command line reports in one line, not a traceback."""


class DataError(ValueError):
    """A dataset that cannot be used as configured: a missing or unpaired file, an empty
    class, an out-of-range label, too few images for a batch. The message names the file
    or setting and the fix."""
