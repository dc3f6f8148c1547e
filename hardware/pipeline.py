"""Pipeline parallelism on a system: activation transfers between submeshes and the PipeFusion
schedule of one diffusion step.

Schedule modelled (PipeFusion, Fang et al., "PipeFusion: Patch-level Pipeline Parallelism for
Diffusion Transformers Inference", arXiv:2405.14430, as run by xDiT): the latent is cut into M
patches along its height; P stages hold consecutive blocks on disjoint submeshes. Stage k works
on patch i while stage k+1 works on patch i-1: a patch never waits for the other patches of its
step, because each stage's spatial self-attention reads the other patches' K/V from the
previous step (the *stale* buffer). One step is then a flow shop of M identical jobs through the
chain ``stage 0, transfer 0->1, stage 1, ..., stage P-1`` (a transfer is a stage of its own, on
the links). For identical jobs the makespan is exact:

    step = sum_j t_j + (M - 1) * max_j t_j

with ``t_j`` the per-patch time of element j; with P equal stages of time c and free transfers
this is the ``(M + P - 1) * c`` of the paper. Each step is modelled as starting with an empty
pipeline (the scheduler update between steps needs the last stage's output of every patch; the
overlap of a step's fill with the previous step's drain that xDiT allows is not counted, so the
figure is an upper bound). The first ``warmup`` steps run unpipelined on the full latent (no stale
K/V exists yet): each stage on the whole sequence, one after another, with full-size transfers.

Transfer model: the boundary activation (``message_bytes``) leaves the sending submesh split
evenly over ``pairs = min(senders, receivers)`` chip pairs, sender i to receiver i, all in
parallel and without link contention; a pair takes ``bytes / pairs / link_bandwidth`` plus one
hop latency per link crossed (cut-through routing). Inside one chip (a submesh sending to
itself) the transfer is free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hardware.collectives import hop_distance
from hardware.spec import SystemSpec


def transfer_time_s(message_bytes: float, senders: Sequence[int], receivers: Sequence[int],
                    system: SystemSpec) -> float:
    """Seconds to move ``message_bytes`` from the chips ``senders`` to the chips ``receivers``."""
    if message_bytes <= 0 or not senders or not receivers:
        return 0.0
    pairs = min(len(senders), len(receivers))
    share = message_bytes / pairs
    slowest = 0.0
    for sender, receiver in zip(senders[:pairs], receivers[:pairs]):
        hops = hop_distance(sender, receiver, system)
        if hops == 0:
            continue
        slowest = max(slowest, share / system.link_bandwidth_bytes_per_s
                      + hops * system.hop_latency_s)
    return slowest


def flow_shop_makespan_s(element_times_s: Sequence[float], jobs: int) -> float:
    """Makespan of ``jobs`` identical jobs through a chain of elements (see the module doc)."""
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: expected at least one")
    if not element_times_s:
        return 0.0
    return sum(element_times_s) + (jobs - 1) * max(element_times_s)


@dataclass(frozen=True)
class PipelineStep:
    """Latency of one pipelined step and of the whole inference."""

    patches: int
    stage_patch_s: tuple[float, ...]
    transfer_patch_s: tuple[float, ...]
    stage_full_s: tuple[float, ...]
    transfer_full_s: tuple[float, ...]
    step_s: float
    warmup_step_s: float
    warmup_steps: int
    steps: int

    @property
    def inference_s(self) -> float:
        warm = min(self.warmup_steps, self.steps)
        return warm * self.warmup_step_s + (self.steps - warm) * self.step_s


def pipefusion_step(stage_patch_s: Sequence[float], transfer_patch_s: Sequence[float],
                    stage_full_s: Sequence[float], transfer_full_s: Sequence[float], *,
                    patches: int, steps: int, warmup_steps: int = 1) -> PipelineStep:
    """Step latencies from per-stage times on one patch and on the full latent, and transfers
    between consecutive stages (P - 1 of each) for one patch and for the full latent."""
    if len(transfer_patch_s) != len(stage_patch_s) - 1 or len(transfer_full_s) != len(
            stage_full_s) - 1:
        raise ValueError("expected one transfer between each two consecutive stages")
    chain: list[float] = []
    for index, stage_s in enumerate(stage_patch_s):
        chain.append(stage_s)
        if index < len(transfer_patch_s):
            chain.append(transfer_patch_s[index])
    return PipelineStep(
        patches=patches, stage_patch_s=tuple(stage_patch_s),
        transfer_patch_s=tuple(transfer_patch_s), stage_full_s=tuple(stage_full_s),
        transfer_full_s=tuple(transfer_full_s),
        step_s=flow_shop_makespan_s(chain, patches),
        warmup_step_s=sum(stage_full_s) + sum(transfer_full_s),
        warmup_steps=warmup_steps, steps=steps)
