from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import Graph, NodeArg, PathLike

class InferenceSession:
    """ONNX Runtime's session interface over nnfuse."""
    graph: Graph
    optimize_report: Dict[str, Any]
    def __init__(self, path_or_bytes: Union[PathLike, bytes, Any], sess_options: Any = None,
                 providers: Optional[Sequence[Any]] = None, provider_options: Optional[Sequence[Any]] = None, *,
                 target: str = "host", pipeline: str = "auto", rules: Sequence[PathLike] = (),
                 shapes: Optional[Mapping[str, Sequence[int]]] = None, profile: bool = True, **kwargs: Any) -> None: ...
    def get_inputs(self) -> List[NodeArg]: ...
    def get_outputs(self) -> List[NodeArg]: ...
    def get_overridable_initializers(self) -> List[NodeArg]: ...
    def get_providers(self) -> List[str]: ...
    def run(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, np.ndarray],
            run_options: Any = None) -> List[np.ndarray]: ...
