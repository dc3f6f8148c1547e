"""The whole-stage invariant on traced stages deep enough to show per-block side work.

The tracer turns XLA's CSE pass off, so every block of a traced stage carries its own copy of the
small side work around it (LayerNorm's 1/N scalar chains, epsilon, the temporal RoPE tables,
``t_mlp``'s rescale). Work that feeds one block belongs to that block's pair, so:

    stage of N pairs = one pair x N + the work outside the pairs

where one pair is the same model's first pair traced alone in stage 0 (split ``0-0,1-7``) and
the outside is what that stage and a last stage holding only the last pair (split ``0-6,7-7``)
run outside their pair: the embeddings and the final layer. With N = 8, charging each copy of
side work outside the pairs puts 8 copies outside the whole stage and 2 in those two stages; the
2-pair split dumps of ``tests/test_invariants.py`` see no such difference.

Traced here (three tiny-width stages, about 15 s), in CI's slow leg; mapped fused and eager on
TX8 and on an H100.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

from hlo_analyzer import analyze, load_module
from hlo_analyzer.mapping.apply import add_hardware_sections
from hlo_analyzer.mapping.results import MappingOptions

pytestmark = [pytest.mark.trace, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Pairs of the deep stage: enough that N - 1 misplaced copies of side work pass the tolerance.
DEEP_PAIRS = 8
#: The invariant's tolerance (fraction of the stage's inference time).
TOLERANCE = 0.005
#: The tiny model's widths, DEEP_PAIRS pairs deep (a model TOML of STDiT3Config fields).
MODEL_TOML = f"""hidden_size = 64
depth = {DEEP_PAIRS}
num_heads = 4
caption_channels = 32
model_max_length = 8
"""


def _trace(out: Path, stage_ids: str, stage: int) -> Path:
    config = out / "deep.toml"
    config.write_text(MODEL_TOML)
    result = subprocess.run([sys.executable, "-m", "tracing.cli", "--config", str(config),
                             "--shape", "28_64_64", "--strategy", "megatron", "--mesh", "2x2",
                             "--stage-ids", stage_ids, "--stage", str(stage), "-o", str(out)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    first, last = stage_ids.split(",")[stage].split("-")
    (dump,) = out.glob(f"deep_28_64_64_megatron_2x2_stage{stage}_pairs{first}-{last}.mlir")
    return dump


@pytest.fixture(scope="module")
def stages(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the whole model as one stage of DEEP_PAIRS pairs, stage 0 holding only the first pair,
    the last stage holding only the last pair) of the same tiny model."""
    out = tmp_path_factory.mktemp("pair_invariant")
    last = DEEP_PAIRS - 1
    return (_trace(out, f"0-{last}", 0), _trace(out, f"0-0,1-{last}", 0),
            _trace(out, f"0-{last - 1},{last}-{last}", 1))


def _mapping(path: Path, hardware: str, mode: str) -> dict:
    module = load_module(str(path))
    report = analyze(module)
    add_hardware_sections(report, module, hardware, steps=1, options=MappingOptions(execution=mode))
    return report.to_dict()["mapping"]


def _pair_times(mapping: dict) -> tuple[list[float], float]:
    """(each pair's time, the time outside the pairs) of one step."""
    pairs = [p["latency_s"] for p in mapping["pairs"] if p["pair"] is not None]
    outside = sum(p["latency_s"] for p in mapping["pairs"] if p["pair"] is None)
    return pairs, outside


@pytest.mark.parametrize("mode", ["fused", "eager"])
@pytest.mark.parametrize("hardware", ["tx8", "h100-sxm"])
def test_a_stage_of_eight_pairs_is_one_pair_times_eight_plus_the_outside(stages, hardware, mode):
    whole, first, last = (_mapping(path, hardware, mode) for path in stages)
    pairs, outside = _pair_times(whole)
    (first_pair,), first_outside = _pair_times(first)
    (last_pair,), last_outside = _pair_times(last)
    assert len(pairs) == DEEP_PAIRS
    # every pair costs what a pair traced alone costs: each carries its own copy of the side work
    assert pairs == pytest.approx([first_pair] * DEEP_PAIRS, rel=1e-9)
    # (the last stage's pair reads its input as an argument: a conversion more, a few ns)
    assert last_pair == pytest.approx(first_pair, rel=1e-3)
    step = whole["totals"]["step_latency_s"]
    assert step == pytest.approx(sum(pairs) + outside, rel=1e-9)
    # what is outside the pairs (the embeddings, the final layer) does not grow with the pairs
    one_pair_times_n = DEEP_PAIRS * first_pair + first_outside + last_outside
    assert abs(one_pair_times_n - step) <= TOLERANCE * step
