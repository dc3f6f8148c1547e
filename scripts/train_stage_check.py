"""The training stage check (``planning.train_check``) of the ten plans drawn by
``plan-search --mode train --hw 4x8xh100 ... --check-stages 10`` at 204_640_360 (listed in
``results/plan_search/train_check_204_640_360_4x8xh100.txt``), without the search around it.

Every stage of each plan is traced whole, the one pair at the plan's shape is traced, and the
estimate is the one that search made: each recompute key from the two calibration programs of
its twin without recompute (at the plan's micro-batch, ZeRO stage and ring degree, rescaled from
the two calibration shapes), its forward once more. The search's present calibrations trace the
micro-batch's own dimension too (``b0 = 12`` and ``7 b0 = 84`` on 8 chips), which the full model
cannot be traced with on a 24 GiB machine at the second calibration shape (123_1920_360 at a
micro-batch of 84: the tracing process is killed for memory), so this script keeps the plan's
micro-batch in both calibration programs, as ``--per-key-calibrations`` does, and derives the
recompute as the search does. Every trace holds the user's trace lock (``flock``).

    python scripts/train_stage_check.py WORK_DIR [--plans 0,3]
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from hardware.spec import load_system
from planning import train_check
from planning.train_estimate import PairCalibration, PairKey, TrainKernels
from planning.train_search import TrainPlan, pair_key

SHAPE, HARDWARE, CONFIG = "204_640_360", "4x8xh100", "full"


def _plan(strategy: str, mesh: tuple[int, int], zero: int, stages: int, ring: int | None = None) -> TrainPlan:
    return TrainPlan(strategy, mesh, zero, True, stages, 8, 32, ring)


#: The ten plans of the results file's stage check, in its order.
PLANS = (_plan("ds_ulysses", (4, 2), 0, 4), _plan("usp", (4, 2), 2, 4, 2), _plan("ds_ulysses", (1, 8), 0, 4),
         _plan("usp", (1, 8), 0, 4, 1), _plan("usp", (2, 4), 0, 4, 1), _plan("usp", (2, 8), 2, 2, 1),
         _plan("ds_ulysses", (2, 8), 0, 2), _plan("usp", (4, 4), 0, 2, 2), _plan("usp", (4, 2), 2, 4, 1),
         _plan("ring_attention", (4, 4), 0, 2))


class RecomputeFromTwin(TrainKernels):
    """A recompute key's calibration: its twin without recompute at the key's micro-batch (both
    shapes), the forward once more; any other key its own programs."""

    def calibration(self, key: PairKey) -> PairCalibration:
        twin = dataclasses.replace(key, recompute=False)
        return PairCalibration(twin, twin, None, key.recompute)


@click.command()
@click.argument("work", type=click.Path(file_okay=False, path_type=Path))
@click.option("--plans", default=",".join(map(str, range(len(PLANS)))), show_default=True,
              help="Indices into the ten plans.")
def main(work: Path, plans: str) -> None:
    system = load_system(HARDWARE)
    kernels = RecomputeFromTwin(work, CONFIG, SHAPE)
    checks = []
    chosen = [PLANS[int(index)] for index in plans.split(",")]
    for number, plan in enumerate(chosen, 1):
        click.echo(f"stage check {number} of {len(chosen)}: {plan.label}", err=True)
        kernels.prepare([pair_key(plan, CONFIG)], system)
        checks += train_check.check_plan(plan, system, CONFIG, SHAPE, kernels)
    click.echo(train_check.render_checks(checks), nl=False)


if __name__ == "__main__":
    main()
