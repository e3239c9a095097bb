"""nnfuse: import ONNX models, rewrite and fuse their graphs DNNFusion-style, compile and run them.

Quick start::

    import numpy as np
    import nnfuse

    graph = nnfuse.load("model.onnx")              # a path, ONNX bytes or an onnx.ModelProto
    report = graph.optimize(target="reference")     # rewrite, classify, plan fusion -> report dict
    compiled = nnfuse.compile(graph, target="reference")
    outputs = compiled.run({"input": np.zeros((1, 3, 224, 224), np.float32)})

or, as a drop-in for ONNX Runtime's session::

    sess = nnfuse.InferenceSession("model.onnx", target="reference")
    (y,) = sess.run(None, {"input": x})

Errors are raised as :class:`nnfuse.Error` subclasses carrying the file/line/node/op at fault.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

# The wheel carries the shipped rules and pipelines under nnfuse/data/rules; the C++ side finds them
# through $NNFUSE_DATA_DIR (an explicit setting by the user wins).
_BUNDLED_DATA = Path(__file__).resolve().parent / "data"
if (_BUNDLED_DATA / "rules" / "pipelines").is_dir() and not os.environ.get("NNFUSE_DATA_DIR"):
    os.environ["NNFUSE_DATA_DIR"] = str(_BUNDLED_DATA)
# Likewise the headers that generated kernels are compiled against.
if (_BUNDLED_DATA / "kernels" / "gen_support.h").is_file() and not os.environ.get("NNFUSE_KERNEL_INCLUDE"):
    os.environ["NNFUSE_KERNEL_INCLUDE"] = str(_BUNDLED_DATA / "kernels")

import numpy as np  # noqa: E402

from . import _core  # noqa: E402
from ._errors import (  # noqa: E402
    Error,
    InvalidArgument,
    IoError,
    ModelError,
    NnfuseRuntimeError,
    ParseError,
    ShapeError,
    UnsupportedError,
)

__version__: str = _core.version()

__all__ = [
    "__version__", "load", "compile", "Graph", "CompiledModel", "InferenceSession", "NodeArg",
    "export_rewritten", "export_fused", "to_dot", "zoo_list", "zoo_load", "zoo_export", "targets",
    "data_dir", "set_data_dir",
    "Error", "ParseError", "ModelError", "UnsupportedError", "ShapeError", "InvalidArgument",
    "NnfuseRuntimeError", "IoError",
]

PathLike = Union[str, "os.PathLike[str]"]

_ORT_TYPES = {
    "float32": "tensor(float)", "float64": "tensor(double)", "float16": "tensor(float16)",
    "bfloat16": "tensor(bfloat16)", "int8": "tensor(int8)", "int16": "tensor(int16)",
    "int32": "tensor(int32)", "int64": "tensor(int64)", "uint8": "tensor(uint8)",
    "uint16": "tensor(uint16)", "uint32": "tensor(uint32)", "uint64": "tensor(uint64)",
    "bool": "tensor(bool)", "string": "tensor(string)",
}


class NodeArg:
    """A model input or output, shaped like ONNX Runtime's ``NodeArg``.

    Attributes:
        name: the tensor's name in the graph.
        shape: one entry per dim: an ``int`` when known, the symbol (``str``) for a named dynamic
            dim, ``None`` for an unnamed unknown one. ``None`` instead of a list when even the rank
            is unknown.
        type: ONNX Runtime's type string, e.g. ``"tensor(float)"``.
        dtype: the numpy dtype name, e.g. ``"float32"``.
    """

    __slots__ = ("name", "shape", "type", "dtype")

    def __init__(self, name: str, shape: Optional[List[Union[int, str, None]]], type: str, dtype: str):
        self.name = name
        self.shape = shape
        self.type = type
        self.dtype = dtype

    @classmethod
    def _from_core(cls, v: "_core.ValueInfo") -> "NodeArg":
        shape: Optional[List[Union[int, str, None]]] = None
        if v.has_shape:
            shape = [d if d >= 0 else (n or None) for d, n in zip(v.dims, v.dim_names)]
        return cls(v.name, shape, _ORT_TYPES.get(v.dtype, f"tensor({v.dtype})"), v.dtype)

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


def _fspath(path: PathLike, what: str) -> str:
    try:
        return os.fspath(path)
    except TypeError:
        raise InvalidArgument(f"{what}: expected a file path, got {type(path).__name__}") from None


class Graph:
    """An ONNX model imported into nnfuse's graph IR. Create one with :func:`nnfuse.load`.

    ``optimize()`` rewrites it in place and plans fusion; ``nnfuse.compile(graph)`` then compiles
    the graph as it stands.
    """

    def __init__(self, core_model: "_core.Model"):
        if not isinstance(core_model, _core.Model):
            raise InvalidArgument("Graph() is not built directly: use nnfuse.load(path_or_bytes)")
        self._m = core_model

    @property
    def name(self) -> str:
        """The file the model came from, or the graph's name."""
        return self._m.name

    @property
    def inputs(self) -> List[NodeArg]:
        """The runtime inputs (initializers excluded)."""
        return [NodeArg._from_core(v) for v in self._m.inputs()]

    @property
    def outputs(self) -> List[NodeArg]:
        """The graph outputs."""
        return [NodeArg._from_core(v) for v in self._m.outputs()]

    @property
    def num_operators(self) -> int:
        """Operators in the graph now (Constant nodes excluded)."""
        return self._m.num_operators()

    @property
    def optimized(self) -> bool:
        """Whether optimize() has run."""
        return self._m.optimized

    @property
    def report(self) -> Dict[str, Any]:
        """The last optimize report (``{}`` before optimize())."""
        return json.loads(self._m.report())

    def optimize(self, pipeline: str = "auto", rules: Sequence[PathLike] = (), target: str = "host", *,
                 pipeline_file: Optional[PathLike] = None, profile: bool = True) -> Dict[str, Any]:
        """Rewrites the graph in place, classifies the network and plans fusion for ``target``.

        Args:
            pipeline: ``"auto"`` (pick by network class), ``"none"``, or a shipped pipeline name
                (``"full"``, ``"residual_cnn"``, ``"transformer_encoder"``, ...).
            rules: user rule files applied on top of the shipped rules.
            target: the target fusion is planned for (``"host"``, ``"x86-avx2"``, ``"reference"``, ...).
            pipeline_file: a pipeline file to run instead of ``pipeline``.
            profile: ``False`` settles undecided fusions by the cost model alone (deterministic).

        Returns:
            The optimize report: ``model``, ``ops_before``, ``ops_after_rewrite``, ``kernels``,
            ``network_class``, ``pipeline`` (pass names), ``passes``, ``blocks``, ``rules_fired``,
            ``flops_before``, ``flops_after`` and more.
        """
        if isinstance(rules, (str, os.PathLike)):
            rules = [rules]
        rule_files = [_fspath(r, "rules") for r in rules]
        pf = "" if pipeline_file is None else _fspath(pipeline_file, "pipeline_file")
        return json.loads(self._m.optimize(pipeline, pf, rule_files, target, profile))

    def export_rewritten(self, path: PathLike) -> None:
        """Writes the graph after rewriting, before fusion, as a standard ONNX model (ORT runs it)."""
        self._m.export_rewritten(_fspath(path, "export_rewritten"))

    def export_fused(self, path: PathLike) -> None:
        """Writes the fused blocks as ``nnfuse``-domain nodes whose bodies are functions (for Netron)."""
        self._m.export_fused(_fspath(path, "export_fused"))

    def to_dot(self, path: Optional[PathLike] = None) -> str:
        """Returns (and, given ``path``, writes) a Graphviz picture of the fusion blocks."""
        text = self._m.to_dot()
        if path is not None:
            Path(_fspath(path, "to_dot")).write_text(text)
        return text

    def save(self, path: PathLike) -> None:
        """Writes the graph as it stands (after optimize(): the rewritten graph) as an ONNX file."""
        self._m.save(_fspath(path, "save"))

    def to_bytes(self) -> bytes:
        """The graph as it stands, as serialized ONNX bytes."""
        return self._m.to_bytes()

    def copy(self) -> "Graph":
        """An independent copy (optimizing it leaves this graph alone)."""
        return Graph(self._m.copy())

    def compile(self, target: str = "host", **kwargs: Any) -> "CompiledModel":
        """Same as ``nnfuse.compile(self, target, ...)``."""
        return compile(self, target, **kwargs)

    def __repr__(self) -> str:
        state = "optimized" if self.optimized else "imported"
        return f"<nnfuse.Graph {self.name!r}: {self.num_operators} operators, {state}>"


class CompiledModel:
    """A graph compiled for one target. Create one with :func:`nnfuse.compile`."""

    def __init__(self, core_compiled: "_core.CompiledModel"):
        if not isinstance(core_compiled, _core.CompiledModel):
            raise InvalidArgument("CompiledModel() is not built directly: use nnfuse.compile(graph)")
        self._c = core_compiled

    @property
    def target(self) -> str:
        """The target it was compiled for."""
        return self._c.target

    @property
    def inputs(self) -> List[NodeArg]:
        return [NodeArg._from_core(v) for v in self._c.inputs()]

    @property
    def outputs(self) -> List[NodeArg]:
        return [NodeArg._from_core(v) for v in self._c.outputs()]

    @property
    def info(self) -> Dict[str, Any]:
        """What the backend reports about the compiled model: target, kernels, ...

        Compiled with ``background=True``: ``info["background"]`` counts the kernel builds per
        set of input shapes that are ``ready``, ``building`` (runs of those shapes use the
        reference kernels meanwhile) and ``failed``.
        """
        return json.loads(self._c.info())

    def wait(self) -> None:
        """Compiled with ``background=True``: blocks until every kernel build started so far is
        done (later runs of those shapes use the generated kernels). Raises the error of a build
        that failed. Returns at once otherwise."""
        self._c.wait()

    def run(self, feeds: Mapping[str, Any], output_names: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
        """Runs the model.

        Args:
            feeds: input name -> numpy array (dtype and dims as the model declares them).
                C-contiguous arrays whose data is 64-byte aligned are read in place; others are copied.
            output_names: the outputs wanted (default: all).

        Returns:
            Output name -> numpy array. The arrays share the buffers the run wrote (no copy).

        Raises:
            InvalidArgument: unknown or missing input, wrong dtype or shape, unknown output name.
        """
        if not isinstance(feeds, Mapping):
            raise InvalidArgument(f"feeds must be a dict of input name -> numpy array, got {type(feeds).__name__}")
        if isinstance(output_names, str):
            output_names = [output_names]
        return self._c.run(dict(feeds), list(output_names or []))

    __call__ = run

    def __repr__(self) -> str:
        return f"<nnfuse.CompiledModel target={self.target!r}>"


def load(path_or_bytes: Union[PathLike, bytes, bytearray, memoryview, Any], *,
         shapes: Optional[Mapping[str, Sequence[int]]] = None) -> Graph:
    """Imports an ONNX model.

    Args:
        path_or_bytes: a file path, serialized ONNX bytes, or an ``onnx.ModelProto``.
        shapes: bind dynamic input dims, e.g. ``{"input": [1, 3, 224, 224]}``.

    Raises:
        IoError: the file cannot be read.  ModelError / ParseError: the bytes are not a valid model.
        UnsupportedError: an operator or opset nnfuse does not implement.
    """
    shape_map = None if shapes is None else {str(k): [int(d) for d in v] for k, v in shapes.items()}
    if hasattr(path_or_bytes, "SerializeToString"):  # onnx.ModelProto
        return Graph(_core.Model.load_bytes(path_or_bytes.SerializeToString(), shape_map, "<onnx.ModelProto>"))
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return Graph(_core.Model.load_bytes(bytes(path_or_bytes), shape_map, "<bytes>"))
    return Graph(_core.Model.load(_fspath(path_or_bytes, "load"), shape_map))


def compile(graph: Graph, target: str = "host", *, threads: int = 0,
            cache_dir: Optional[PathLike] = None, profile: bool = True, background: bool = False,
            precision: str = "fp32") -> CompiledModel:
    """Compiles ``graph`` as it stands for ``target``.

    An optimized graph runs block by block as its fusion plan says; a graph not optimized runs one
    kernel per operator. ``"reference"`` runs the reference kernels (the oracle); ``"host"``,
    ``"x86-avx2"``, ... use the generated kernels where the library has a code generator for them.
    ``profile=True`` times each 3x3 convolution's algorithms (direct, Winograd) on this machine
    and keeps the fastest (timings cached per machine and layer shape); ``False`` uses the cost
    model alone, deterministically.

    ``background=True`` returns at once and builds the generated kernels in a background thread:
    until they are ready for a run's input shapes, that run is served by the reference kernels
    (same fusion plan, same results within float tolerance, much slower), then by the generated
    ones. A model with dynamic input dims starts a build for each new set of input shapes at its
    first run; builds run one at a time and pick conv algorithms by the cost model (as
    ``profile=False``). A failed build is raised by every later run of its input shapes and by
    :meth:`CompiledModel.wait`. The build shares the CPU with the runs it serves; dropping the
    model waits for builds still going.

    ``precision="fp16"`` (GPU target ``"volta-cuda"``, GPUs of sm_70 and later) runs MatMul, Gemm
    and Conv tiles on tensor cores: operands rounded to fp16, products accumulated in fp32. Other
    targets take ``"fp32"`` only.
    """
    if not isinstance(graph, Graph):
        raise InvalidArgument(f"compile() takes an nnfuse.Graph (from nnfuse.load), got {type(graph).__name__}")
    cd = "" if cache_dir is None else _fspath(cache_dir, "cache_dir")
    return CompiledModel(_core.compile(graph._m, target, threads, cd, bool(profile), bool(background),
                                         str(precision)))


def export_rewritten(graph: Graph, path: PathLike) -> None:
    """Writes ``graph`` after rewriting, before fusion, as a standard ONNX model."""
    graph.export_rewritten(path)


def export_fused(graph: Graph, path: PathLike) -> None:
    """Writes ``graph``'s fused blocks as ``nnfuse``-domain function nodes (viewable in Netron)."""
    graph.export_fused(path)


def to_dot(graph: Graph, path: Optional[PathLike] = None) -> str:
    """Returns (and, given ``path``, writes) a Graphviz picture of ``graph``'s fusion blocks."""
    return graph.to_dot(path)


def zoo_list() -> List[str]:
    """Names of the built-in zoo models."""
    return list(_core.zoo_names())


def zoo_load(name: str, seed: int = 0) -> Graph:
    """A built-in zoo model (seeded random weights) as a Graph."""
    return Graph(_core.Model.zoo(name, seed))


def zoo_export(name: str, path: PathLike, seed: int = 0) -> str:
    """Writes a built-in zoo model to ``path`` as ONNX; returns the path."""
    p = _fspath(path, "zoo_export")
    _core.Model.zoo(name, seed).save(p)
    return p


def targets() -> List[str]:
    """Every target name nnfuse knows (not all have a code generator in every build)."""
    return list(_core.targets())


def data_dir() -> str:
    """Where the shipped rules and pipelines are read from."""
    return _core.data_dir()


def set_data_dir(path: PathLike) -> None:
    """Reads the shipped rules and pipelines from ``path`` (sets ``$NNFUSE_DATA_DIR``)."""
    p = _fspath(path, "set_data_dir")
    os.environ["NNFUSE_DATA_DIR"] = p
    _core.set_data_dir(p)


from ._session import InferenceSession  # noqa: E402
