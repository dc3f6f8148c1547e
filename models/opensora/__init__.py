"""OpenSora v1.2 STDiT3 for tracing: configs, inputs, the model and its exact analytic counts.

`config`, `inputs` (all but `make_inputs`) and `flops` work without torch; `stdit3` needs it.
"""

from models.opensora.config import CONFIGS, STDiT3Config, get_config
from models.opensora.inputs import Geometry, VideoShape, geometry, parse_shape

__all__ = [
           "CONFIGS",
           "Geometry",
           "STDiT3Config",
           "VideoShape",
           "geometry",
           "get_config",
           "parse_shape",
]
