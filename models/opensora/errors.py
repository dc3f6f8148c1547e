"""Usage errors of the model package: one-line messages naming the bad value and what was expected."""

from hlo_trace.errors import UsageError

__all__ = ["ConfigError", "ShapeError", "StageRangeError"]


class ConfigError(UsageError):
    """An unknown config name, an unreadable TOML file or inconsistent sizes."""


class ShapeError(UsageError):
    """A video shape string that is malformed or too small to be patched."""


class StageRangeError(UsageError):
    """A block range outside 0..depth-1 or with first > last."""
