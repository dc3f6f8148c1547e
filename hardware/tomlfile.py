"""Reading a TOML data file of ``hardware/data`` (a chip, a system, an NCCL table) into a dict,
every failure as one :class:`hlo_trace.errors.InputFileError` line naming the file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from hlo_trace.errors import InputFileError, shown

__all__ = ["read_toml"]


def read_toml(path: Path) -> dict[str, Any]:
    """The parsed file; InputFileError when it cannot be read or is not valid UTF-8 TOML."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise InputFileError(f"{shown(path)}: cannot read: {error.strerror or error}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise InputFileError(f"{path}: not valid TOML: {error}") from None
