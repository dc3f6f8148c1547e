"""Trace any ``torch.nn.Module`` under SPMD (``trace-module``, docs/trace_module.md).

The module is built by its factory on the ``meta`` device (no memory, no download: its weights
are never materialised), then every parameter and buffer becomes a tensor without a buffer on the
XLA device, split as the plan says (``tracing.tracer.device_tensor``, the placeholders of
``trace-stage``), the inputs likewise; forward hooks mark the activations the plan names
(``mark_sharding`` on a module's output or input); the forward runs lazily (inference) or a
training step does (``--mode train``: forward, mean squared error against a ``target`` input of
the output's shape, autograd's backward, AdamW with ``tracing.training``'s update and scopes);
the graph is compiled without executing and XLA's partitioned module captured
(``tracing.capture``). Values are never computed, so the weights' initialisation does not matter.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hlo_trace.errors import UsageError
from hlo_trace.numbers import brief
from plans.module_plan import (
    InputSpec,
    ModulePlan,
    PlanError,
    Rule,
    Spec,
    check_spec,
    parse_factory,
    resolve_spec,
    spec_json,
    unmatched_rules,
)

Progress = Callable[[str], None]


@dataclass
class TracedModule:
    """The lazily traced program: its output tensors, the buffers of a training step (the
    sidecar's ``training`` section) and what each step took."""

    outputs: list[Any]
    output_shapes: dict[str, dict[str, Any]]
    parameters: int
    training: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    split_placeholders: list[Any] = field(default_factory=list)


@contextmanager
def user_code(what: str) -> Iterator[None]:
    """Run the user's code (their module's import, the factory, the forward): whatever it raises
    (``SystemExit`` and other ``BaseException`` included) is the user's error, one line saying
    ``<what> raised <type>: <message>``. A ``KeyboardInterrupt`` it raises itself is such an
    error; one raised by a real Ctrl-C (SIGINT while it runs) stays an interrupt."""
    signalled = []

    def on_interrupt(number: int, frame: Any) -> None:
        signalled.append(number)
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_interrupt) if main else None
    try:
        yield
    except (PlanError, UsageError):
        raise
    except KeyboardInterrupt:
        if signalled:
            raise
        raise PlanError(f"{what} raised KeyboardInterrupt itself (no Ctrl-C was pressed)") from None
    except BaseException as error:  # noqa: BLE001 - the user's code: its error, in one line
        message = str(error).splitlines()[0] if str(error) else ""
        raise PlanError(f"{what} raised {type(error).__name__}: {brief(message, 200)}") from None
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def load_factory(factory: str) -> Callable[..., Any]:
    """The callable at ``pkg.module:factory``; one line when the module or the name is missing."""
    module_name, attribute = parse_factory(factory)
    _import_from_current_directory()
    with user_code(f"model {factory}: importing {module_name}"):
        try:
            target: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            raise PlanError(f"model {factory}: cannot import module {module_name} ({error})") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise PlanError(f"model {factory}: module {module_name} has no factory {attribute}")
        target = getattr(target, part)
    if not callable(target):
        raise PlanError(f"model {factory}: {attribute} is not callable")
    return target


def _import_from_current_directory() -> None:
    """Put the current directory first on the import path, as ``python -m`` does: a console
    script's path starts at its own directory, so ``trace-module mymodel:make`` would not find
    ``./mymodel.py`` (docs/trace_module.md: the current directory, ``PYTHONPATH``, the installed
    packages)."""
    here = os.getcwd()
    if not any(os.path.abspath(entry or ".") == here for entry in sys.path):
        sys.path.insert(0, here)
        importlib.invalidate_caches()


def build_model(factory: str, kwargs: dict[str, Any], dtype: str):
    """The module the factory makes, on ``meta``, in ``dtype`` (floating tensors only)."""
    import torch

    make = load_factory(factory)
    with user_code(f"model {factory}: the factory"), torch.device("meta"):
        model = make(**kwargs)
    if not isinstance(model, torch.nn.Module):
        raise PlanError(f"model {factory}: the factory returned {type(model).__name__}, "
                        "not a torch.nn.Module")
    return model.to(getattr(torch, dtype))


def check_plan(plan: ModulePlan, model, inputs: list[InputSpec], *, mode: str = "infer") -> None:
    """Every rule of a plan file must match a parameter, input or module of the model (a
    training step's ``target`` is an input too)."""
    checks = (
        ("parameter", plan.parameters, [name for name, _ in model.named_parameters()]),
        ("input", plan.inputs, [spec.name for spec in inputs] + (["target"] if mode == "train" else [])),
        ("module", plan.activations, [name for name, _ in model.named_modules() if name]),
    )
    for what, rules, names in checks:
        unmatched = unmatched_rules(rules, names, plan.optional)
        if unmatched:
            rule = unmatched[0]
            sample = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            raise PlanError(f"{rule.origin}: pattern {rule.pattern!r} matches no {what} of the "
                            f"model ({len(names)} {what}s: {sample or 'none'})")


def _resolved(rule_spec: Spec | None, shape: tuple[int, ...], what: str,
              plan: ModulePlan) -> Spec | None:
    if rule_spec is None:
        return None
    spec = resolve_spec(rule_spec, shape)
    check_spec(spec, shape, what, plan.axis_sizes)
    return spec if any(entry is not None for entry in spec) else None


def trace_module(model, plan: ModulePlan, inputs: list[InputSpec], *, mode: str, dtype: str,
                 progress: Progress = lambda step: None) -> TracedModule:
    """Place ``model`` (built on meta) and ``inputs`` on the XLA device under ``plan`` and run
    the forward (or the training step) lazily; see the module docstring."""
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs

    from tracing.tracer import device_tensor, drop_lazy_values, lay_out_placeholders

    seconds: dict[str, float] = {}
    train = mode == "train"
    progress("shard")
    started = time.perf_counter()
    mesh = xs.Mesh(np.arange(plan.devices), plan.mesh_shape, plan.axes)
    device = torch_xla.device()
    split: list[Any] = []
    params: dict[str, Any] = {}
    specs: dict[str, Spec | None] = {}
    replaced: dict[int, Any] = {}
    for name, param in list(model.named_parameters(remove_duplicate=False)):
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        new = replaced.get(id(param))
        if new is None:  # a tied weight is one tensor, placed once
            shape = tuple(param.shape)
            spec = _resolved(plan.parameter_spec(name), shape, f"parameter {name}", plan)
            tensor = device_tensor(shape, param.dtype, spec, mesh, device, None, buffer=False)
            new = replaced[id(param)] = torch.nn.Parameter(
                tensor, requires_grad=train and param.dtype.is_floating_point)
            params[name], specs[name] = new, spec
            if spec is not None:
                split.append(new)
        owner._parameters[leaf] = new
    for name, buffer in list(model.named_buffers(remove_duplicate=False)):
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        owner._buffers[leaf] = device_tensor(tuple(buffer.shape), buffer.dtype, None, mesh,
                                             device, None, buffer=False)
    tensors = {}
    for spec_in in inputs:
        spec = _resolved(plan.input_spec(spec_in.name), spec_in.shape, f"input {spec_in.name}",
                         plan)
        tensors[spec_in.name] = device_tensor(spec_in.shape, getattr(torch, spec_in.dtype), spec,
                                              mesh, device, None, buffer=False)
        if spec is not None:
            split.append(tensors[spec_in.name])
    _install_activation_marks(model, plan, mesh)
    drop_lazy_values(device)
    seconds["shard"] = time.perf_counter() - started

    progress("trace")
    started = time.perf_counter()
    traced = TracedModule(outputs=[], output_shapes={}, parameters=len(params),
                          seconds=seconds, split_placeholders=split)
    if train:
        _train_step(model, plan, mesh, tensors, params, specs, dtype, traced, device)
    else:
        with torch.no_grad():
            result = _call(model, tensors)
        for index, tensor in enumerate(_flatten(result)):
            traced.outputs.append(tensor)
            traced.output_shapes[f"output{index}"] = _described(tensor)
        _check_computes(traced.outputs, result)
    lay_out_placeholders(split)
    seconds["trace"] = time.perf_counter() - started
    return traced


def global_hlo(outputs: list[Any]) -> str:
    """HLO text of the lazy graph that computes ``outputs``, before SPMD partitioning (global
    shapes: the one-device program, its sharding marks aside); nothing is compiled."""
    import torch_xla

    return torch_xla._XLAC._get_xla_tensors_hlo(list(outputs))


def _call(model, tensors: dict[str, Any]):
    names = ", ".join(f"{n}={list(t.shape)}" for n, t in tensors.items())
    what = f"the model's forward({names})"
    with user_code(what), _no_readback(what):
        return model(**tensors)


#: Tensor methods that read a value of the program back into Python (``.item()``, ``print``,
#: ``if tensor:``, ``int(tensor)``): the trace compiles the program and never runs it, and
#: torch-xla, asked for a value, runs the program part-built (the trace process died of SIGSEGV).
_READBACKS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__",
              "__repr__", "__format__")


@contextmanager
def _no_readback(what: str) -> Iterator[None]:
    """Within: a read-back (:data:`_READBACKS`) is a one-line error naming it; any other
    execution torch-xla would start (``.to("cpu")``) raises torch-xla's own RuntimeError.

    The read-backs are replaced on ``torch.Tensor`` while the forward runs, not intercepted by a
    ``TorchFunctionMode``: a mode's Python frame would be the innermost frame of every op, and
    torch-xla writes that frame as the op's source location (``XLA_HLO_DEBUG``), where the
    analysis reads the model's library calls (``hlo_analyzer.mapping.library_calls``)."""
    import torch
    import torch_xla

    def refuse(name: str):
        def readback(*args: Any, **kwargs: Any) -> Any:
            raise PlanError(f"{what} calls Tensor.{name}(), which reads a value "
                            "of the program; a trace compiles the program and never runs it: "
                            "compute without reading values (no .item(), print or Python "
                            "branch on a tensor)")
        return readback

    own = {name: torch.Tensor.__dict__[name] for name in _READBACKS if name in torch.Tensor.__dict__}
    allowed = torch_xla._XLAC._get_allow_execution()
    torch_xla._XLAC._set_allow_execution(False)
    try:
        for name in _READBACKS:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name in _READBACKS:
            if name in own:
                setattr(torch.Tensor, name, own[name])
            else:
                delattr(torch.Tensor, name)
        torch_xla._XLAC._set_allow_execution(allowed)


def _check_computes(outputs: list[Any], result: Any) -> None:
    """A forward must compute a tensor: one that returns none (``None``, a number) or only its
    inputs and parameters unchanged (``torch.nn.Identity``) leaves XLA no program to compile."""
    from tracing.capture import is_stored_data

    if not outputs:
        raise PlanError(f"the model's forward returned {type(result).__name__}, no tensor: "
                        "there is no program to trace")
    if all(is_stored_data(tensor) for tensor in outputs):
        raise PlanError("the model's forward computes nothing: it returns its inputs or "
                        "parameters unchanged (e.g. torch.nn.Identity), so there is no program "
                        "to trace")


def _flatten(result) -> list[Any]:
    """The tensors of a forward's result (a tensor, a tuple/list, or a dict), in order."""
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, dict):
        return [t for value in result.values() for t in _flatten(value)]
    if isinstance(result, (tuple, list)):
        return [t for value in result for t in _flatten(value)]
    return []


def _described(tensor) -> dict[str, Any]:
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch.")}


def _install_activation_marks(model, plan: ModulePlan, mesh) -> None:
    """Forward hooks that mark a module's output (or pre-hooks its first input) as a rule says."""
    for name, module in model.named_modules():
        for rule in plan.activation_rules(name) if name else ():
            if rule.where == "output":
                module.register_forward_hook(_output_mark(rule, name, plan, mesh))
            else:
                module.register_forward_pre_hook(_input_mark(rule, name, plan, mesh))


def _mark_tensor(tensor, rule: Rule, what: str, plan: ModulePlan, mesh):
    """``tensor`` marked with the rule's spec; with ``then``, a copy of it marked ``then``
    (``pin_with_gradient``: a training step's gradient is exchanged back at the same point)."""
    import torch
    import torch_xla.distributed.spmd as xs

    from tracing.strategies.base import pin_with_gradient

    if not isinstance(tensor, torch.Tensor):
        raise PlanError(f"{rule.origin}: {what} is a {type(tensor).__name__}, not a tensor to mark")
    shape = tuple(tensor.shape)
    spec = resolve_spec(rule.spec, shape)
    check_spec(spec, shape, what, plan.axis_sizes)
    then = resolve_spec(rule.then, shape) if rule.then is not None else None
    if then is not None:
        check_spec(then, shape, what, plan.axis_sizes)
    if tensor.requires_grad:
        return pin_with_gradient(tensor, mesh, spec, then)
    xs.mark_sharding(tensor, mesh, spec)
    if then is None:
        return tensor
    copy = tensor.clone()
    xs.mark_sharding(copy, mesh, then)
    return copy


def _output_mark(rule: Rule, name: str, plan: ModulePlan, mesh):
    def hook(module, args, output):
        what = f"the output of module {name}"
        if isinstance(output, (tuple, list)) and output:
            return type(output)([_mark_tensor(output[0], rule, what, plan, mesh), *output[1:]])
        return _mark_tensor(output, rule, what, plan, mesh)

    return hook


def _input_mark(rule: Rule, name: str, plan: ModulePlan, mesh):
    def hook(module, args):
        if not args:
            raise PlanError(f"{rule.origin}: module {name} is called without a positional input")
        return (_mark_tensor(args[0], rule, f"the input of module {name}", plan, mesh), *args[1:])

    return hook


def _pin(tensor, mesh, spec: Spec | None) -> None:
    """Mark ``tensor`` with ``spec`` (replicated when None)."""
    import torch_xla.distributed.spmd as xs

    xs.mark_sharding(tensor, mesh, spec if spec is not None else (None,) * tensor.dim())


def _train_step(model, plan: ModulePlan, mesh, tensors: dict[str, Any], params: dict[str, Any],
                specs: dict[str, Spec | None], dtype: str, traced: TracedModule, device) -> None:
    """Forward + MSE against ``target`` + backward + AdamW (``tracing.training``'s update), with
    its buffers for the sidecar's ``training`` section."""
    import torch

    from tracing.tracer import device_tensor
    from tracing.training import (  # noqa: I001
        ADAM_EPS,
        BETAS,
        FORWARD_SCOPE,
        GRAD,
        INPUT,
        LEARNING_RATE,
        OPTIMIZER_SCOPE,
        OPTIMIZER_STATE,
        OUTPUT,
        PARAM,
        STEP,
        WEIGHT_DECAY,
        Buffer,
        adamw_update,
        ir_scope,
        optimizer_bytes_per_parameter,
    )

    axis_sizes = plan.axis_sizes
    arguments = [Buffer(n, PARAM, tuple(p.shape), dtype, specs[n]) for n, p in params.items()]
    arguments += [Buffer(n, INPUT, tuple(t.shape), str(t.dtype).removeprefix("torch."),
                         _resolved(plan.input_spec(n), tuple(t.shape), f"input {n}", plan))
                  for n, t in tensors.items()]
    with ir_scope(FORWARD_SCOPE):
        with torch.enable_grad():
            outputs = [t for t in _flatten(_call(model, tensors)) if t.dtype.is_floating_point]
        if not outputs:
            raise UsageError("--mode train: the model's forward returned no floating tensor to "
                             "take a loss of")
        output = outputs[0]
        if not output.requires_grad:
            raise UsageError("--mode train: the model's first floating output depends on no "
                             "trainable parameter (e.g. torch.nn.Identity): there is no gradient "
                             "to take")
        shape = tuple(output.shape)
        target_spec = _resolved(plan.input_spec("target"), shape, "input target", plan) \
            if plan.input_spec("target") is not None else None
        target = device_tensor(shape, output.dtype, target_spec, mesh, device, None)
        arguments.append(Buffer("target", INPUT, shape, str(output.dtype).removeprefix("torch."),
                                target_spec))
        loss = ((output.float() - target.float()) ** 2).mean()
    loss.backward()
    results: list[tuple[Buffer, Any]] = [(Buffer("loss", OUTPUT, (), "float32", None), loss)]
    master_needed = dtype != "float32"
    with torch.no_grad(), ir_scope(OPTIMIZER_SCOPE):
        for name, p in params.items():
            if p.grad is None:
                continue  # not on the loss's path (an unused parameter)
            shape, spec = tuple(p.shape), specs[name]
            states = {}
            for state in (("master",) if master_needed else ()) + ("exp_avg", "exp_avg_sq"):
                states[state] = device_tensor(shape, torch.float32, spec, mesh, device, None)
                arguments.append(Buffer(f"{name}.{state}", OPTIMIZER_STATE, shape, "float32", spec))
            master = states.get("master", p)
            new_master, new_avg, new_sq = adamw_update(master.float(), p.grad, states["exp_avg"],
                                                       states["exp_avg_sq"])
            for tensor in (new_master, new_avg, new_sq, p.grad):
                _pin(tensor, mesh, spec)
            results.append((Buffer(name, PARAM, shape, dtype, spec), new_master.to(p.dtype)))
            if master_needed:
                results.append((Buffer(f"{name}.master", OPTIMIZER_STATE, shape, "float32", spec),
                                new_master))
            results.append((Buffer(f"{name}.exp_avg", OPTIMIZER_STATE, shape, "float32", spec),
                            new_avg))
            results.append((Buffer(f"{name}.exp_avg_sq", OPTIMIZER_STATE, shape, "float32",
                                   spec), new_sq))
            results.append((Buffer(f"{name}.grad", GRAD, shape, dtype, spec), p.grad))
    traced.outputs = [tensor for _, tensor in results]
    traced.output_shapes = {"loss": {"shape": [], "dtype": "float32"}}
    traced.training = {
        "mode": "train", "zero": 0, "recompute": "none",
        "bytes_per_parameter": optimizer_bytes_per_parameter(dtype),
        "optimizer": {"name": "AdamW", "lr": LEARNING_RATE, "betas": list(BETAS), "eps": ADAM_EPS,
                      "weight_decay": WEIGHT_DECAY, "step": STEP},
        "loss": "mse(the first floating output, target)",
        "scopes": {"forward": FORWARD_SCOPE, "optimizer": OPTIMIZER_SCOPE},
        "mesh_axes": dict(axis_sizes),
        "arguments": [b.to_dict(axis_sizes) for b in arguments],
        "outputs": [b.to_dict(axis_sizes) for b, _ in results],
    }


__all__ = ["TracedModule", "build_model", "check_plan", "global_hlo", "load_factory", "spec_json",
           "trace_module"]
