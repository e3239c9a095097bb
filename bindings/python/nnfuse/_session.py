"""InferenceSession: ONNX Runtime's session interface over nnfuse, so switching is one line::

    sess = onnxruntime.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    sess = nnfuse.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import CompiledModel, Graph, NodeArg, PathLike, compile, load
from ._errors import InvalidArgument


class InferenceSession:
    """Loads, optimizes and compiles a model; runs it with ONNX Runtime's ``run`` signature.

    Args:
        path_or_bytes: a model file path, serialized ONNX bytes, or an ``onnx.ModelProto``.
        sess_options, providers, provider_options: accepted for ONNX Runtime compatibility and
            ignored: nnfuse chooses its kernels by ``target``.
        target: ``"host"`` (generated kernels for this CPU), ``"x86-avx2"``, ..., or ``"reference"``.
        pipeline: ``"auto"`` (by network class), ``"none"`` (run the graph as imported) or a
            shipped pipeline name.
        rules: user rule files applied on top of the shipped ones.
        shapes: bind dynamic input dims, e.g. ``{"input": [1, 3, 224, 224]}``.
        profile: ``False`` settles undecided fusions by the cost model alone.
        background: return as soon as the model is optimized and serve runs with the reference
            kernels while the generated ones are built in a background thread (per set of input
            shapes for dynamic dims); see :func:`nnfuse.compile`. :meth:`wait` blocks until they
            are ready.
        precision: ``"fp32"``, or ``"fp16"`` on ``target="volta-cuda"``: MatMul/Gemm/Conv tiles on
            tensor cores (fp16 operands, fp32 accumulation).

    Attributes:
        graph: the optimized :class:`nnfuse.Graph`.
        optimize_report: the optimize report (``{}`` with ``pipeline="none"``).
    """

    def __init__(self, path_or_bytes: Union[PathLike, bytes, Any], sess_options: Any = None,
                 providers: Optional[Sequence[Any]] = None, provider_options: Optional[Sequence[Any]] = None, *,
                 target: str = "host", pipeline: str = "auto", rules: Sequence[PathLike] = (),
                 shapes: Optional[Mapping[str, Sequence[int]]] = None, profile: bool = True, background: bool = False,
                 precision: str = "fp32", **kwargs: Any):
        self.graph: Graph = load(path_or_bytes, shapes=shapes)
        self.optimize_report: Dict[str, Any] = {}
        if pipeline != "none":
            self.optimize_report = self.graph.optimize(pipeline, rules, target, profile=profile)
        self._compiled: CompiledModel = compile(self.graph, target, background=background, precision=precision)
        self._inputs = self._compiled.inputs
        self._outputs = self._compiled.outputs
        self._target = target

    def wait(self) -> None:
        """With ``background=True``: blocks until the kernel builds started so far are done
        (raising the error of one that failed); at once otherwise."""
        self._compiled.wait()

    @property
    def info(self) -> Dict[str, Any]:
        """The compiled model's report (:attr:`nnfuse.CompiledModel.info`)."""
        return self._compiled.info

    def get_inputs(self) -> List[NodeArg]:
        """The model's runtime inputs (name, shape, type), as ONNX Runtime lists them."""
        return list(self._inputs)

    def get_outputs(self) -> List[NodeArg]:
        """The model's outputs (name, shape, type)."""
        return list(self._outputs)

    def get_overridable_initializers(self) -> List[NodeArg]:
        """Always empty: initializers are folded into the compiled kernels."""
        return []

    def get_providers(self) -> List[str]:
        """The 'provider' nnfuse runs on: ``["nnfuse:<target>"]``."""
        return [f"nnfuse:{self._target}"]

    def run(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any],
            run_options: Any = None) -> List[np.ndarray]:
        """Runs the model.

        Args:
            output_names: the outputs wanted, in order; ``None`` or empty: every output.
            input_feed: input name -> numpy array.
            run_options: accepted for ONNX Runtime compatibility and ignored.

        Returns:
            One numpy array per requested output, in the order asked.

        Raises:
            InvalidArgument: unknown or missing input, wrong dtype or shape, unknown output name.
        """
        if isinstance(output_names, str):
            output_names = [output_names]
        names = list(output_names) if output_names else [o.name for o in self._outputs]
        if not isinstance(input_feed, Mapping):
            raise InvalidArgument(f"input_feed must be a dict of input name -> numpy array, got {type(input_feed).__name__}")
        results = self._compiled.run(input_feed, names)
        return [results[n] for n in names]

    def run_with_ort_values(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("nnfuse.InferenceSession takes numpy arrays: use run()")

    def __repr__(self) -> str:
        return f"<nnfuse.InferenceSession target={self._target!r} inputs={[i.name for i in self._inputs]}>"
