"""Today's video diffusion transformers, written for tracing from their public architecture
descriptions and released configurations (docs/videodit.md; the configurations' sources in
docs/sources.md): HunyuanVideo (``hunyuan_video``), Wan 2.1 (``wan21``, 1.3B and 14B) and
CogVideoX-5B (``cogvideox``). Random weights, nothing downloaded; every factory's defaults are a
tiny configuration that traces in seconds, and each model has a full-size configuration
(``configs.py``). ``plans.py`` holds xDiT's strategies for them as ``trace-module`` plans.
"""
