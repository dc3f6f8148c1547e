"""Pipeline parallelism on a system: activation transfers between submeshes and the PipeFusion
schedule of a whole inference.

Schedule modelled (PipeFusion, Fang et al., "PipeFusion: Patch-level Pipeline Parallelism for
Diffusion Transformers Inference", arXiv:2405.14430, as xDiT runs it): the latent is cut into M
patches along its height; P stages hold consecutive blocks on disjoint submeshes. Stage k works
on patch m while stage k+1 works on patch m-1: a patch never waits for the other patches of its
step, because each stage's spatial self-attention reads the other patches' K/V from the
previous step (the *stale* buffer). The last stage finishes a patch's noise prediction, takes
the patch's scheduler step (its cost is not counted) and sends the updated latent patch (stage
0's input ``z``, 1/M of it) straight back to stage 0 (xDiT's pipeline group is a ring).

Elements: ``e_0 .. e_{L-1}`` = stage 0, transfer 0->1, stage 1, ..., stage P-1, return P-1->0
(a transfer is an element of its own, on the links), with per-patch times ``d_i``. Every element
serves the jobs one at a time in the order (step 0, patch 0), (0, 1), ..., (0, M-1), (1, 0), ...
Number the jobs ``j = s*M + m`` and let ``C[i][j]`` be the time element i finishes job j:

    C[i][j] = max(C[i-1][j], C[i][j-1]) + d_i                   for i >= 1
    C[0][j] = max(R(j), C[0][j-1]) + d_0                        (C[.][-1] = 0)

where ``R(j)`` is when job j's input is back at stage 0, per schedule:

* ``overlapped`` (xDiT, the default): ``R(j) = C[L-1][j-M]``, patch m of step s+1 needs only
  patch m of step s back from the last stage; steps overlap, so the pipeline fills and drains
  once per inference.
* ``per-step`` (a system that synchronises every step): ``R(s*M + m) = C[L-1][s*M - 1]`` for every
  m, step s+1 starts once the whole of step s is back; every step fills and drains.

``R(j) = 0`` in the first pipelined step (or the end of the warm-up, below). The pipelined steps
end when the last stage finishes the last patch, ``C[L-2][S*M - 1]`` (the last step sends
nothing back). :func:`pipelined_steps_s` evaluates the recurrence (the closed forms below,
:func:`closed_form_steps_s`, when it would take more than ``RECURRENCE_MAX_UPDATES`` updates). Closed forms (longest paths
through the recurrence's graph), with ``D = max_i d_i``, ``D' = max_{i <= L-2} d_i`` and
``T = sum_i d_i``, ``T' = sum_{i <= L-2} d_i`` (without the return), S pipelined steps:

    per-step:    (S - 1) * (T + (M - 1) * D) + T' + (M - 1) * D'
    overlapped:  max over w in 0..S-1 of  w*T + T' + ((S - w)*M - 1) * D_w
                 (D_0 = D', D_w = D for w >= 1; linear in w, so w in {0, 1, S-1} suffice)

A path that wraps w times through the return runs w whole loops; w = 0 is "fill once, S*M patch
times of the bottleneck, drain once", w = S-1 is the loop bound when P stages are too many for M
patches (T > M * D: a patch is back at stage 0 only after a whole loop). The steady-state time of
a step is ``max(T, M * D)`` overlapped and ``T + (M - 1) * D`` per step (with P equal stages of
time c, free transfers and return, ``max(P, M) * c`` against the paper's ``(M + P - 1) * c``).

The first ``warmup`` steps run unpipelined on the full latent (no stale K/V exists yet; xDiT's
synchronous warm-up): each stage on the whole sequence, one after another, full-size transfers,
and the full latent sent back to stage 0 before the next step.

Transfer model: the boundary activation (``message_bytes``) leaves the sending submesh split
evenly over ``pairs = min(senders, receivers)`` chip pairs, sender i to receiver i, all in
parallel and without link contention; a pair takes ``bytes / pairs / link_bandwidth`` plus one
hop latency per link crossed (cut-through routing). Inside one chip (a submesh sending to
itself) the transfer is free. The return uses the links' other direction (or other links) and
is an element of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hardware.collectives import hop_distance, node_system
from hardware.spec import SystemSpec


def transfer_time_s(message_bytes: float, senders: Sequence[int], receivers: Sequence[int],
                    system: SystemSpec) -> float:
    """Seconds to move ``message_bytes`` from the chips ``senders`` to the chips ``receivers``.

    On a multi-node system a pair on two nodes sends over the sender's NICs (the pairs leaving
    one node share that node's NICs, :meth:`hardware.spec.InterNodeNetwork.nic_bytes_per_s`)
    and pays one inter-node latency; a pair inside a node uses the node's network."""
    if message_bytes <= 0 or not senders or not receivers:
        return 0.0
    pairs = min(len(senders), len(receivers))
    share = message_bytes / pairs
    slowest = 0.0
    network = system.inter_node
    node = node_system(system)
    crossing: dict[int, int] = {}
    if network is not None:
        for sender, receiver in zip(senders[:pairs], receivers[:pairs]):
            if network.node_of(sender) != network.node_of(receiver):
                crossing[network.node_of(sender)] = crossing.get(network.node_of(sender), 0) + 1
    for sender, receiver in zip(senders[:pairs], receivers[:pairs]):
        if network is not None:
            if network.node_of(sender) != network.node_of(receiver):
                count = crossing[network.node_of(sender)]
                slowest = max(slowest, share * count / network.nic_bytes_per_s(count) + network.latency_s)
                continue
            sender, receiver = network.local_id(sender), network.local_id(receiver)
        hops = hop_distance(sender, receiver, node)
        if hops == 0:
            continue
        slowest = max(slowest, share / node.link_bandwidth_bytes_per_s
                      + hops * node.hop_latency_s)
    return slowest


def flow_shop_makespan_s(element_times_s: Sequence[float], jobs: int) -> float:
    """Makespan of ``jobs`` identical jobs through a chain of elements, each serving one job at
    a time, starting empty: ``sum + (jobs - 1) * max`` of the element times (exact for identical
    jobs: the longest path of the recurrence in the module doc without the return)."""
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: expected at least one")
    if not element_times_s:
        return 0.0
    return sum(element_times_s) + (jobs - 1) * max(element_times_s)


#: ``overlapped``: steps overlap, fill and drain once per inference (xDiT's PipeFusion);
#: ``per-step``: every step starts with an empty pipeline (a system that synchronises each step).
SCHEDULES = ("overlapped", "per-step")
DEFAULT_SCHEDULE = "overlapped"


def pipelined_steps_s(chain_s: Sequence[float], return_s: float, *, patches: int, steps: int,
                      schedule: str = DEFAULT_SCHEDULE) -> float:
    """Seconds from the first pipelined step's start (every patch's input at stage 0, the
    elements idle) to the last stage finishing the last patch of the ``steps``-th step: the
    recurrence of the module doc over ``chain_s`` (stage 0, transfer, stage 1, ..., stage P-1:
    per-patch times) and the per-patch ``return_s`` from stage P-1 back to stage 0."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: expected one of {', '.join(SCHEDULES)}")
    if patches < 1:
        raise ValueError(f"patches={patches}: expected at least one")
    if steps < 1 or not chain_s:
        return 0.0
    if steps * patches * (len(chain_s) + 1) > RECURRENCE_MAX_UPDATES:
        return closed_form_steps_s(chain_s, return_s, patches=patches, steps=steps,
                                   schedule=schedule)
    elements = [*chain_s, return_s]
    done = [0.0] * len(elements)  # C[i][j-1]: when element i finished its previous job
    back = [0.0] * patches        # C[L-1][j-M]: when patch m's input got back to stage 0
    for step in range(steps):
        last = step == steps - 1
        if schedule == "per-step":
            back = [max(back)] * patches
        for patch in range(patches):
            ready = back[patch]
            for index, element_s in enumerate(elements[:-1] if last else elements):
                ready = max(ready, done[index]) + element_s
                done[index] = ready
            back[patch] = ready
    return done[len(chain_s) - 1]


#: Above this many element updates (steps x patches x elements) :func:`pipelined_steps_s`
#: takes the closed form instead of walking the recurrence: 10**6 steps of 10**6 patches would
#: take hours; the two agree to rounding (tests/test_hardening.py compares them).
RECURRENCE_MAX_UPDATES = 200_000


def closed_form_steps_s(chain_s: Sequence[float], return_s: float, *, patches: int, steps: int,
                        schedule: str = DEFAULT_SCHEDULE) -> float:
    """:func:`pipelined_steps_s` by the closed forms of the module doc (longest paths through
    the recurrence's graph), in constant time."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: expected one of {', '.join(SCHEDULES)}")
    if steps < 1 or not chain_s:
        return 0.0
    loop_s, bottleneck_s = sum(chain_s) + return_s, max(*chain_s, return_s)
    open_s, open_bottleneck_s = sum(chain_s), max(chain_s)  # T', D': without the return
    if schedule == "per-step":
        return ((steps - 1) * (loop_s + (patches - 1) * bottleneck_s)
                + open_s + (patches - 1) * open_bottleneck_s)
    wraps = {w for w in (1, steps - 1) if 1 <= w <= steps - 1}
    return max([open_s + (steps * patches - 1) * open_bottleneck_s]
               + [w * loop_s + open_s + ((steps - w) * patches - 1) * bottleneck_s for w in wraps])


def _chain(stage_s: Sequence[float], transfer_s: Sequence[float]) -> list[float]:
    chain: list[float] = []
    for index, element_s in enumerate(stage_s):
        chain.append(element_s)
        if index < len(transfer_s):
            chain.append(transfer_s[index])
    return chain


@dataclass(frozen=True)
class PipelineStep:
    """Latency of one pipelined step (steady state) and of the whole inference under
    ``schedule``. ``step_s`` is the time a pipelined step adds once the pipeline runs:
    ``max(T, M * D)`` overlapped, ``T + (M - 1) * D`` per step (module doc); ``inference_s``
    is the recurrence's exact total, warm-up included."""

    schedule: str
    patches: int
    stage_patch_s: tuple[float, ...]
    transfer_patch_s: tuple[float, ...]
    return_patch_s: float
    stage_full_s: tuple[float, ...]
    transfer_full_s: tuple[float, ...]
    return_full_s: float
    step_s: float
    warmup_step_s: float
    warmup_steps: int
    steps: int
    inference_s: float


def pipefusion_step(stage_patch_s: Sequence[float], transfer_patch_s: Sequence[float],
                    stage_full_s: Sequence[float], transfer_full_s: Sequence[float], *,
                    patches: int, steps: int, warmup_steps: int = 1, return_patch_s: float = 0.0,
                    return_full_s: float = 0.0, schedule: str = DEFAULT_SCHEDULE) -> PipelineStep:
    """Step and inference latencies from per-stage times on one patch and on the full latent,
    transfers between consecutive stages (P - 1 of each) for one patch and for the full latent,
    and the return from the last stage to stage 0 (a latent patch, the full latent)."""
    if len(transfer_patch_s) != len(stage_patch_s) - 1 or len(transfer_full_s) != len(
            stage_full_s) - 1:
        raise ValueError("expected one transfer between each two consecutive stages")
    chain = _chain(stage_patch_s, transfer_patch_s)
    pipelined = max(steps - warmup_steps, 0)
    warm = min(warmup_steps, steps)
    warmup_step_s = sum(stage_full_s) + sum(transfer_full_s)
    warmup_phase_s = warm * warmup_step_s + (warm if pipelined else max(warm - 1, 0)) * (
        return_full_s)
    loop = [*chain, return_patch_s]
    step_s = (max(sum(loop), patches * max(loop)) if schedule == "overlapped"
              else flow_shop_makespan_s(loop, patches))
    return PipelineStep(
        schedule=schedule, patches=patches, stage_patch_s=tuple(stage_patch_s),
        transfer_patch_s=tuple(transfer_patch_s), return_patch_s=return_patch_s,
        stage_full_s=tuple(stage_full_s), transfer_full_s=tuple(transfer_full_s),
        return_full_s=return_full_s, step_s=step_s, warmup_step_s=warmup_step_s,
        warmup_steps=warmup_steps, steps=steps,
        inference_s=warmup_phase_s + pipelined_steps_s(
            chain, return_patch_s, patches=patches, steps=pipelined, schedule=schedule))
