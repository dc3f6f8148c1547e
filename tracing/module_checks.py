"""What ``trace-module`` says about a plan that does not split the model as its name suggests
(docs/trace_module.md, "When a plan splits less than it says").

* A plan that shards nothing (no parameter, input or activation split on a mesh of several
  devices: a shorthand whose rules match none of the model's names) is an error: every device
  would compute the whole model, silently.
* Otherwise a warning with the **redundancy factor**, devices x per-device GEMM FLOPs over the
  one-device GEMM FLOPs (1 when the devices share the GEMM work exactly; 4 on 4 devices that each
  compute everything), when it exceeds :data:`REDUNDANCY_TOLERANCE` or when a cause of redundancy
  is seen before the trace: a group of a shorthand's rules that matches no module, a linear layer
  megatron leaves whole, a head count the devices do not divide (GSPMD then splits the head
  dimension and computes part of the attention on several devices).

The one-device GEMM FLOPs are those of the traced graph before SPMD partitioning (torch-xla's
HLO of the lazy tensors: global shapes), so no second trace is needed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from plans.module_plan import (
    ATTENTION_IN_NAMES,
    ATTENTION_PARENTS,
    COLUMN_NAMES,
    ROW_NAMES,
    InputSpec,
    ModulePlan,
    PlanError,
    Spec,
    resolve_spec,
)

#: A redundancy factor above 1 + this is reported without another cause (a sequence-parallel
#: cross-attention that projects every caption on each batch group repeats under 1.3% of the
#: GEMM work by design; an unevenly split head dimension repeats several percent).
REDUNDANCY_TOLERANCE = 0.02
#: Module attributes read as head counts (the names the zoo, Hugging Face and timm use).
HEAD_ATTRIBUTES = ("heads", "kv_heads", "n_heads", "n_kv_heads", "num_heads",
                   "num_attention_heads", "num_key_value_heads", "n_head")
#: Names listed in a message at most.
NAMES_SHOWN = 4


def _splits(spec: Spec | None, shape: tuple[int, ...] | None = None) -> bool:
    if spec is None:
        return False
    resolved = resolve_spec(spec, shape) if shape is not None else spec
    return any(entry is not None and entry != "replicated" for entry in resolved)


def _sample(names: list[str]) -> str:
    return ", ".join(names[:NAMES_SHOWN]) + (", ..." if len(names) > NAMES_SHOWN else "")


def check_shards_something(plan: ModulePlan, model, inputs: list[InputSpec]) -> None:
    """A :class:`PlanError` when the plan splits no parameter, input or activation of the model
    on a mesh of more than one device."""
    if plan.devices == 1:
        return
    parameters = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    if any(_splits(plan.parameter_spec(name), shape) for name, shape in parameters):
        return
    if any(_splits(plan.input_spec(spec.name), spec.shape) for spec in inputs):
        return
    for name, _ in model.named_modules():
        rules = plan.activation_rules(name) if name else []
        if any(_splits(rule.spec) or _splits(rule.then) for rule in rules):
            return
    source = f"strategy {plan.shorthand}" if plan.shorthand else "the plan"
    raise PlanError(
        f"{source} shards nothing of the model on {plan.devices} devices: its rules match none "
        f"of the model's parameters ({_sample([n for n, _ in parameters]) or 'none'}) and split "
        "no input, so every device would compute the whole model; name the model's layers in a "
        "plan file ([[parameters]], docs/trace_module.md)")


def _last(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _inside_attention(name: str) -> bool:
    return any(parent in part for part in name.split(".")[:-1] for parent in ATTENTION_PARENTS)


def _shorthand_groups(shorthand: str | None) -> dict[str, Any]:
    """A shorthand's groups of module rules: description -> predicate on a module name."""
    if shorthand == "megatron":
        return {"column-parallel names": lambda n: _last(n) in COLUMN_NAMES,
                "row-parallel names": lambda n: _last(n) in ROW_NAMES}
    if shorthand == "sp":
        return {"q/k/v projection names": lambda n: _last(n) in ATTENTION_IN_NAMES,
                "attention output names": lambda n: _last(n) in ROW_NAMES and _inside_attention(n)}
    return {}


_GROUP_NAMES = {"column-parallel names": COLUMN_NAMES, "row-parallel names": ROW_NAMES,
                "q/k/v projection names": ATTENTION_IN_NAMES, "attention output names": ROW_NAMES}


def redundancy_causes(plan: ModulePlan, model) -> list[str]:
    """What the plan leaves to compute on several devices, seen before the trace."""
    import torch

    modules = [(name, module) for name, module in model.named_modules() if name]
    causes = []
    for group, matches in _shorthand_groups(plan.shorthand).items():
        if not any(matches(name) for name, _ in modules):
            causes.append(f"strategy {plan.shorthand}'s {group} ({_sample(list(_GROUP_NAMES[group]))}) "
                          "match no module of the model")
    if plan.shorthand == "megatron":
        whole = [name for name, module in modules if isinstance(module, torch.nn.Linear)
                 and not _splits(plan.parameter_spec(f"{name}.weight"))]
        if whole:
            causes.append(f"linear layers no rule splits: {_sample(whole)}")
    if plan.shorthand in ("megatron", "sp"):
        odd = [f"{name}.{attribute}={value}" for name, module in modules
               for attribute, value in _head_counts(module) if value % plan.devices]
        if odd:
            causes.append(f"head counts the {plan.devices} devices do not divide: {_sample(odd)}")
    return causes


def _head_counts(module) -> Iterable[tuple[str, int]]:
    for attribute in HEAD_ATTRIBUTES:
        value = getattr(module, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            yield attribute, value


def gemm_flops(hlo_text: str, origin: str) -> int:
    """GEMM FLOPs of an HLO module (per device after partitioning, global before)."""
    from hlo_analyzer.mlir import hlo_text_to_mlir_text
    from hlo_analyzer.report import analyze

    return analyze(hlo_text_to_mlir_text(hlo_text, "stablehlo", origin=origin).encode(),
                   name=origin).gemm_flops


def redundancy_warning(plan: ModulePlan, per_device_gemm: int, one_device_gemm: int,
                       causes: list[str]) -> str | None:
    """The warning line (without ``Warning:``), or None when the devices share the GEMM work
    and nothing suggests otherwise."""
    if plan.devices == 1 or one_device_gemm <= 0:
        return None
    factor = plan.devices * per_device_gemm / one_device_gemm
    if factor <= 1 + REDUNDANCY_TOLERANCE and not causes:
        return None
    extra = f"{factor - 1:.1%} more GEMM work than one device's" if factor > 1 else "no GEMM work repeated"
    return (f"redundancy factor {factor:.3f} (devices x per-device GEMM FLOPs / one-device GEMM "
            f"FLOPs = {plan.devices} x {per_device_gemm:,} / {one_device_gemm:,}: {extra})"
            + ("; " + "; ".join(causes) if causes else ""))


__all__ = ["REDUNDANCY_TOLERANCE", "check_shards_something", "gemm_flops", "redundancy_causes",
           "redundancy_warning"]
