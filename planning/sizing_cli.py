"""``plan-search --mode train`` and ``plan-search --target-latency / --target-step-time``: the
report text, the sizing curve's plot, and the traced confirmation (``planning.train_search``,
``planning.sizing``; docs/plan_search.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hardware import load_system
from hlo_trace.atomic import write_png
from hlo_trace.errors import UsageError

#: Bytes per GB as the reports print memory (decimal).
GIGA = 1e9
#: Plans the training report lists below the best.
TRAIN_PLANS_SHOWN = 10
#: Memory classes of a training step, in the order the reports print them.
MEMORY_CLASSES = ("param", "grad", "optimizer_state", "activation")


@dataclass(frozen=True)
class PairConfirmation:
    """One block pair's training step, traced and analysed on the system, beside the estimate."""

    dump: str
    traced_step_s: float
    estimated_step_s: float
    traced_memory: tuple[tuple[str, float], ...]
    estimated_memory: tuple[tuple[str, float], ...]


def confirm_training_pair(outcome, config: str, shape: str, hardware: str, work: Path) -> PairConfirmation:
    """Trace one block pair of the plan's stage at the plan's shape and micro-batch (under
    the user's trace lock, ``planning.train_estimate.trace_lock``; cached in ``work``) and cost it on ``hardware``."""
    from planning.train_estimate import TrainKernels
    from planning.train_search import pair_key

    key = pair_key(outcome.plan, config)
    value = TrainKernels(work, config, shape).full(key, load_system(hardware))
    if isinstance(value, str):
        raise UsageError(f"tracing {outcome.plan.label} failed: {value}")
    groups, memory = value
    return PairConfirmation(
        dump=key.name(shape), traced_step_s=sum(g.compute_s + g.comm_s for g in groups.values()),
        estimated_step_s=outcome.estimate.pair_step_s,
        traced_memory=tuple((k, float(memory.get(k, 0))) for k in MEMORY_CLASSES),
        estimated_memory=outcome.estimate.pair_memory)


def _memory_text(estimate) -> str:
    return (f"P {estimate.param_bytes / GIGA:.3g} GB, G {estimate.grad_bytes / GIGA:.3g} GB, "
            f"OS {estimate.optimizer_bytes / GIGA:.3g} GB, Act {estimate.activation_bytes / GIGA:.3g} GB "
            f"(total {estimate.memory_bytes / GIGA:.3g} GB)")


def render_train_report(result, confirmation: PairConfirmation | None, refused: list[str]) -> str:
    """The training search's report: the best plan with its memory classes and step, the
    fastest fitting plans, why plans were refused (``refused``: plan-search's lines), and the
    traced pair beside the estimate."""
    limit = result.memory_limit_bytes / GIGA
    lines = [f"plan-search --mode train: {result.config} at {result.shape} on {result.hardware} "
             f"({result.devices} devices), memory limit {limit:.4g} GB per device",
             f"space: {len(result.outcomes)} training plans estimated, {len(result.space.infeasible)} "
             f"refused; {len(result.fitting)} fit"]
    lines += refused + [""]
    best = result.best
    if best is None:
        lines.append("best plan: none is estimated to fit the memory limit")
    else:
        plan, estimate = best.plan, best.estimate
        how = f"traced {best.traced_step_s:.4g} s" if best.traced else "estimate"
        lines += [f"best plan ({how}): {plan.label}",
                  f"  ZeRO stage {plan.zero}, {'full' if plan.recompute else 'no'} recompute, "
                  f"{plan.stages} pipeline stage(s) x {plan.micro_batches} micro-batch(es), stage mesh "
                  f"{plan.mesh[0]}x{plan.mesh[1]} ({plan.strategy}), data-parallel degree {plan.data_parallel}"
                  + (f", ring degree {plan.ring}" if plan.ring is not None else ""),
                  f"  step {estimate.step_s:.4g} s ({plan.batch / estimate.step_s:.3g} samples/s, "
                  f"estimate; {estimate.basis}): compute {estimate.compute_s:.4g} s, activation "
                  f"communication, sends and bubble {estimate.activation_comm_s:.4g} s, "
                  + (f"once per step (optimizer, gradient sums) {estimate.update_s:.4g} s"
                     if estimate.basis.startswith("traced kernels")
                     else f"gradient/parameter communication {estimate.gradient_comm_s:.4g} s"),
                  f"  memory per device: {_memory_text(estimate)}"]
    lines += ["", f"fastest plans that fit (estimate), {min(TRAIN_PLANS_SHOWN, len(result.fitting))} of "
              f"{len(result.fitting)}:",
              f"  {'plan':52s} {'step s':>9s} {'P GB':>7s} {'G GB':>7s} {'OS GB':>7s} {'Act GB':>8s}"]
    for outcome in result.fitting[:TRAIN_PLANS_SHOWN]:
        e = outcome.estimate
        lines.append(f"  {outcome.plan.label:52s} {e.step_s:9.4g} {e.param_bytes / GIGA:7.3g} "
                     f"{e.grad_bytes / GIGA:7.3g} {e.optimizer_bytes / GIGA:7.3g} {e.activation_bytes / GIGA:8.3g}")
    lines += _traced_lines(result)
    if confirmation is not None:
        traced, estimated = dict(confirmation.traced_memory), dict(confirmation.estimated_memory)
        lines += ["", f"traced confirmation: one block pair of the best plan's stage ({confirmation.dump}), "
                  f"analysed on {result.hardware}:",
                  f"  step of the pair: traced {confirmation.traced_step_s * 1e3:.4g} ms, estimate "
                  f"{confirmation.estimated_step_s * 1e3:.4g} ms (estimate / traced "
                  f"{confirmation.estimated_step_s / confirmation.traced_step_s:.3f})"]
        for key in MEMORY_CLASSES:
            ratio = estimated[key] / traced[key] if traced[key] else float("nan")
            lines.append(f"  {key:16s} traced {traced[key] / GIGA:9.4g} GB, estimate "
                         f"{estimated[key] / GIGA:9.4g} GB (estimate / traced {ratio:.4f})")
    return "\n".join(lines) + "\n"


def _traced_lines(result) -> list[str]:
    """Every traced plan's estimated step beside the traced one, and the estimate's agreement."""
    from planning.plan_search import ESTIMATE_TOLERANCE, MIN_RANKED_PLANS

    traced = [o for o in result.outcomes if o.traced or o.error is not None]
    if not traced:
        return []
    lines = ["", "traced plans, estimated step beside traced (s; the traced pair of the stage at the plan's "
             "shape, composed as the estimate):",
             f"  {'plan':52s} {'estimate s':>10s} {'traced s':>10s} {'est/traced':>10s} {'pair mem':>8s}"]
    for o in traced:
        drawn = "*" if o.plan in result.validation else " "
        if o.error is not None:
            lines.append(f" {drawn}{o.plan.label:52s} {o.estimate.step_s:10.4g} failed: {o.error}")
            continue
        estimated, measured = dict(o.estimate.pair_memory), dict(o.traced_pair_memory)
        memory = sum(measured.values()) / sum(estimated.values()) if sum(estimated.values()) else float("nan")
        lines.append(f" {drawn}{o.plan.label:52s} {o.estimate.step_s:10.4g} {o.traced_step_s:10.4g} "
                     f"{o.ratio:10.4f} {memory:8.4f}")
    rho, worst = result.spearman, result.worst_ratio
    within, count = result.within
    lines.append("estimate on the traced plans: Spearman rank correlation "
                 + (f"n/a (fewer than {MIN_RANKED_PLANS} traced plans)" if rho is None else f"{rho:.3f}")
                 + ", worst ratio " + ("n/a" if worst is None else f"{worst:.4f}")
                 + " (max of estimate/traced and traced/estimate)")
    lines.append(f"estimate within {ESTIMATE_TOLERANCE:.0%} of the traced step: {within} of {count} traced plans "
                 f"({len(result.validation)} of them drawn at random from the fitting rest, marked *); "
                 "pair mem: the traced pair's P+G+OS+Act over the formulas'; estimate basis: "
                 + (traced[0].estimate.basis if traced else "n/a"))
    return lines


def render_sizing(result, confirmed: str | None = None) -> str:
    """The sizing answer and its curve as a table."""
    what = "inference latency" if result.mode == "infer" else "training step"
    lines = [f"plan-search sizing: {result.config} at {result.shape} on {result.hardware}, target "
             f"{what} {result.target_s:.4g} s, memory limit {result.memory_limit_bytes / GIGA:.4g} GB per device"]
    traced = {t.devices: t for t in result.traces}
    if result.answer is None:
        lines.append(f"answer: no device count up to {result.curve[-1].devices} meets the target"
                     + (f" (traced {len(result.traces)} plan(s), none met it)" if result.traces else ""))
    else:
        a = result.answer
        how = "traced" if result.confirmed else "estimate"
        seconds = traced[a.devices].traced_s if result.confirmed else a.seconds
        memory = traced[a.devices].traced_memory_bytes if result.confirmed else a.memory_bytes
        lines.append(f"answer: {a.devices} devices: {a.best_label}: {seconds:.4g} s ({how}), "
                     f"{memory / GIGA:.4g} GB per device")
    if confirmed:
        lines.append(confirmed)
    if result.uncalibrated:
        label, reason = result.uncalibrated[0]
        lines.append(f"NOT RANKED: {len(result.uncalibrated)} plan(s) could not be calibrated for the traced-kernel "
                     f"estimate (no ideal stand-in); first: {label}: {reason}")
    missed = result.missed_below
    if missed is not None and result.answer is not None:
        lines.append(f"the next smaller count, {missed.devices} devices, misses it: its best estimated plan "
                     + (f"failed to trace ({missed.error})" if missed.traced_s is None else
                        f"traced {missed.traced_s:.4g} s"))
    for t in result.traces:
        verdict = (f"failed: {t.error}" if t.error is not None else
                   f"traced {t.traced_s:.4g} s, {t.traced_memory_bytes / GIGA:.4g} GB per device: "
                   + ("meets the target" if t.traced_s <= result.target_s
                      and t.traced_memory_bytes <= result.memory_limit_bytes else "does NOT meet the target"))
        lines.append(f"  confirmation {t.devices} devices, {t.label}: estimate {t.estimate_s:.4g} s, {verdict}")
    lines += ["", f"best estimated {what} by device count:",
              f"  {'devices':>7s} {'plans':>6s} {'seconds':>10s} {'GB/device':>9s}  best plan"]
    for p in result.curve:
        left_out = f"  ({p.uncalibrated} not calibrated, not ranked)" if p.uncalibrated else ""
        if p.seconds is None:
            lines.append(f"  {p.devices:7d} {p.plans:6d} {'-':>10s} {'-':>9s}  none fits{left_out}")
        else:
            mark = "  <- meets the target" if p.seconds <= result.target_s else ""
            lines.append(f"  {p.devices:7d} {p.plans:6d} {p.seconds:10.4g} {p.memory_bytes / GIGA:9.4g}  "
                         f"{p.best_label}{mark}{left_out}")
    return "\n".join(lines) + "\n"


def plot_sizing(result, path: str, *, force: bool) -> None:
    """The curve (log-log) with the target and the answer marked, as a PNG (the plot extra,
    checked by the caller)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    points = [p for p in result.curve if p.seconds is not None]
    fig, axis = plt.subplots(figsize=(7, 4.5))
    axis.plot([p.devices for p in points], [p.seconds for p in points], "o-", color="C0",
              label="best plan that fits (estimate)")
    axis.axhline(result.target_s, color="C3", linestyle="--", label=f"target {result.target_s:.3g} s")
    done = [t for t in result.traces if t.traced_s is not None]
    if done:
        axis.scatter([t.devices for t in done], [t.traced_s for t in done], marker="x", s=60, color="C1",
                     zorder=3, label="traced confirmations")
    if result.answer is not None:
        seconds = next((t.traced_s for t in done if t.devices == result.answer.devices), result.answer.seconds)
        axis.scatter([result.answer.devices], [seconds], marker="*", s=180, color="C3",
                     zorder=4, label=f"answer: {result.answer.devices} devices")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("devices")
    axis.set_ylabel("inference latency, s" if result.mode == "infer" else "training step, s")
    axis.set_title(f"sizing: {result.config} {result.shape} on {result.hardware}", fontsize=9)
    axis.legend(fontsize=7)
    fig.tight_layout()
    write_png(fig, path, force=force)
    plt.close(fig)
