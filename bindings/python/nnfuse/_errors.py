"""nnfuse's exception types.

Every failure inside nnfuse is raised as a subclass of :class:`Error`, chosen by what went wrong, and
carries the place at fault as attributes (``None`` where unknown):

- ``kind``: "parse", "model", "unsupported", "shape", "invalid", "runtime" or "io"
- ``detail``: the message without the location prefix
- ``file``, ``line``, ``col``: the model, rule or pipeline file and the 1-based position in it
- ``node``, ``op``, ``opset``: the graph node, its operator type and opset

The classes also derive from the closest built-in exception (``ValueError``, ``OSError``, ...), so
code that catches those keeps working.
"""
from __future__ import annotations

from typing import Optional

__all__ = [
    "Error", "ParseError", "ModelError", "UnsupportedError", "ShapeError",
    "InvalidArgument", "NnfuseRuntimeError", "IoError",
]


class Error(Exception):
    """Base class of every nnfuse exception."""

    kind: str = "error"
    detail: Optional[str] = None
    file: Optional[str] = None
    line: Optional[int] = None
    col: Optional[int] = None
    node: Optional[str] = None
    op: Optional[str] = None
    opset: Optional[int] = None

    def __init__(self, message: str = "", **where):
        super().__init__(message)
        self.detail = where.pop("detail", message)
        for key, value in where.items():
            setattr(self, key, value)


class ParseError(Error, ValueError):
    """A rule, pipeline or model file has a syntax error (``file``, ``line``, ``col`` say where)."""
    kind = "parse"


class ModelError(Error, ValueError):
    """A malformed model: bad protobuf bytes, dangling edge, cycle, wrong operator arity, ..."""
    kind = "model"


class UnsupportedError(Error, NotImplementedError):
    """An operator, opset, dtype or target nnfuse does not implement."""
    kind = "unsupported"


class ShapeError(Error, ValueError):
    """Shape or dtype inference failed, or shapes are inconsistent."""
    kind = "shape"


class InvalidArgument(Error, ValueError):
    """An invalid argument: a bad feed (name, dtype, shape), an unknown target, pipeline or output."""
    kind = "invalid"


class NnfuseRuntimeError(Error, RuntimeError):
    """A failure while compiling or executing (kernel, toolchain)."""
    kind = "runtime"


class IoError(Error, OSError):
    """A file cannot be read or written."""
    kind = "io"


# The class raised for each kind (nnfuse._core picks it by the C++ error's kind name).
_BY_KIND = {cls.kind: cls for cls in (ParseError, ModelError, UnsupportedError, ShapeError, InvalidArgument,
                                      NnfuseRuntimeError, IoError)}
