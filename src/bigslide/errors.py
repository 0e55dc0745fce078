"""Errors that users see. Every message names the file, row or parameter at fault."""

from __future__ import annotations


class BigslideError(Exception):
    """Base class: the CLI prints these as one line and exits non-zero."""


class SlideError(BigslideError):
    """A slide file is missing, unreadable or unsuitable. The message names the path."""


class RegionError(BigslideError):
    """A regions file is malformed, or a region does not fit the slide."""


class DataError(BigslideError):
    """A slide table (CSV) or dataset parameter is wrong. The message names the row or column."""


class ConfigError(BigslideError):
    """A configuration value is wrong. The message names the parameter."""


class TrainingError(BigslideError):
    """Training cannot go on (non-finite loss, out of memory, checkpoint write failure)."""
