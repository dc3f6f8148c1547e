"""The order in which a generation allocates and frees device memory, recorded by running it on
PyTorch's ``meta`` device.

PyTorch runs a model eagerly: every ATen op allocates its outputs, and under
``torch.inference_mode`` a tensor's memory is freed the moment its last reference goes. That
sequence is what the CUDA caching allocator serves, and what it reserves at the peak depends on
the order, not only on the live bytes (docs/gpu.md, "Peak memory"). On ``meta`` the same Python
code runs the same ops on tensors without data, in seconds and without memory, and a
``TorchDispatchMode`` sees each op's outputs: a storage not seen before is an allocation of its
bytes, and a ``weakref.finalize`` on the storage (whose Python object PyTorch keeps as long as any
tensor holds it) records its free at the moment it happens. FlashAttention-2 is called directly
(``models.opensora.official.flash_attention_2_on_meta``) since SDPA on ``meta`` writes the scores.

What ``meta`` cannot show: memory a kernel library takes through the allocator without
returning a tensor (cuBLAS's and cuDNN's workspaces), and memory outside it (the CUDA context).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from models.cuda_runtime import AllocationTrace, Mark

#: Steps of the demo's sampling loop (``configs/opensora-v1-2/inference/sample.py``: 30 rflow steps).
DEMO_STEPS = 30


class AllocationRecorder(TorchDispatchMode):
    """Records every new ``meta`` storage an op returns and the moment it is freed."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[int] = []
        self.marks: list[Mark] = []
        self._allocations = 0
        self._live: dict[int, int] = {}   # storage address -> allocation id

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204, ARG002
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta":
                self._allocated(tensor.untyped_storage())
        return out

    def _allocated(self, storage: torch.UntypedStorage) -> None:
        key, size = storage._cdata, storage.nbytes()
        if key in self._live or size == 0:   # a view, an in-place op, or nothing to allocate
            return
        ident = self._allocations
        self._allocations += 1
        self._live[key] = ident
        self.events.append(size)
        weakref.finalize(storage, self._freed, key, ident)

    def _freed(self, key: int, ident: int) -> None:
        if self._live.get(key) == ident:
            del self._live[key]
            self.events.append(-ident - 1)

    def mark(self, name: str, *, empty_cache: bool = False) -> None:
        self.marks.append(Mark(name, len(self.events), empty_cache))

    def trace(self) -> AllocationTrace:
        return AllocationTrace(tuple(self.events), tuple(self.marks))


def record_generations(shapes: Sequence[str], steps: int = DEMO_STEPS, config_name: str = "full",
                       progress: Callable[[str], None] = lambda _line: None) -> AllocationTrace:
    """The allocations of loading the demo's models once, then generating each of ``shapes`` in
    turn, each after ``torch.cuda.empty_cache()`` (``benchmarks/gpu_generation.py``'s run; one
    shape is the demo's first generation). Marks: ``<shape> begin`` (empty the cache, reset the
    peaks) and ``<shape> <phase>`` at the end of each of ``models.opensora.memory.GENERATION_PHASES``."""
    from models.opensora.generation import DemoModels, generate
    from models.opensora.official import flash_attention_2_on_meta

    recorder = AllocationRecorder()

    def loading() -> AbstractContextManager:
        return recorder

    with torch.device("meta"):
        models = DemoModels(config_name, "meta", torch.bfloat16, loading)
    recorder.mark("weights loaded")
    for shape in shapes:
        progress(f"recording {shape}: {steps} steps, the decode and the save on the meta device")
        recorder.mark(f"{shape} begin", empty_cache=True)
        with torch.inference_mode(), flash_attention_2_on_meta(), recorder:
            generate(models, shape, steps, lambda phase, shape=shape: recorder.mark(f"{shape} {phase}"))
    return recorder.trace()
