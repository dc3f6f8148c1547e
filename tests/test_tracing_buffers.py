"""A compile-only trace holds no buffer, and its split tensors are still split graph parameters.

The tracer makes every tensor of a compile-only trace without a buffer (tracing/tracer.py:
split ones as lazy values that ``drop_lazy_values`` turns into placeholders keeping their spec,
``lay_out_placeholders`` giving the spec to their graph parameters once traced).  One process
(torch-xla fixes its device count per process) prepares, traces and captures stage 1 of
``--stage-ids 0-0,1-1`` of the tiny model under megatron on 2x2 and reports what it saw.

Counted by hand from megatron's layout (tracing/strategies/megatron.py): each block splits the
columns of qkv, the cross-attention's q and kv and fc1 (weight and bias: 2 tensors each) and the
rows of proj, the cross-attention's proj and fc2 (the weight only): 4*2 + 3 = 11 tensors, 22 for
the pair's two blocks; nothing else of the stage is split. On 4 devices the qkv weight (192, 64)
is (48, 64) per device, fc1's (256, 64) is (64, 64), fc2's (64, 256) is (64, 64) and each
proj weight (64, 64) is (64, 16).

A compile-only training step holds no buffer either: the gradients of an inner stage's outputs
(the backward's extra inputs) are placeholders that keep their split. They were real shards:
the hidden states of the micro-batch, which for the full model at 123_1920_360 and a
micro-batch of 84 (the training estimate's second calibration program) is 19 GB of gradient,
and that trace was killed for memory on a 24 GiB machine. By hand from ds_ulysses' layout
(tracing/strategies/ds_ulysses.py), the middle pair of the 3-pair tiny model on 2x2 (batch 4,
28_64_64: N = 8 x 16 = 128 tokens, h = 64): the hidden states x (4, 128, 64) are split, batch
over x and tokens over y, (2, 64, 64) per device, as the stage's input and as the gradient of
its output ``grad_x``: two split parameters of that shape in the partitioned program.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

REPO_ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, re, sys
from tracing import capture

session = capture.prepare_process(4)
capture.enable_spmd()
import torch_xla
from plans.config import build_config
from tracing.stages import boundary_shapes, stage_parameters
from tracing.tracer import compile_stage, prepare_stage, run_forward

config = build_config(config="tiny", strategy="megatron", mesh="2x2", stage_ids="0-0,1-1")
traced = prepare_stage(config, 1, boundary_shapes(config, None))
tensors = [*stage_parameters(traced.model, traced.stage).values(), *traced.inputs.values()]
report = {"tensors": len(tensors),
          "without_buffer": sum(torch_xla._XLAC._is_placecholder(t) for t in tensors),
          "split_made": len(traced.split_placeholders)}
run_forward(traced, config)
hlo = compile_stage(session, traced)
entry = hlo[hlo.rindex("\nENTRY "):]
parameters = re.findall(r"= (\w+\[[\d,]*\])\S* parameter\(\d+\)(.*)", entry)
report["parameters"] = len(parameters)
report["split_shapes"] = sorted(shape for shape, rest in parameters if "sharding={devices=" in rest)
print(json.dumps(report))
sys.stdout.flush()
capture.end_process(session)
"""


TRAIN_SCRIPT = r"""
import json, re, sys
from tracing import capture

session = capture.prepare_process(4, keep_every_op=False)
capture.enable_spmd()
import torch_xla
import tracing.tracer
from plans.config import build_config
from plans.train_options import TrainOptions
from tracing.stages import boundary_shapes
from tracing.training import trace_train_step

made = []
device_tensor = tracing.tracer.device_tensor
def spy(*args, **kwargs):
    made.append(device_tensor(*args, **kwargs))
    return made[-1]
tracing.tracer.device_tensor = spy

config = build_config(config=sys.argv[1], shape="28_64_64", strategy="ds_ulysses", mesh="2x2",
                      stage_ids="0-0,1-1,2-2", batch=4)
step = trace_train_step(config, 1, boundary_shapes(config, None), TrainOptions(zero=0, recompute="none"))
tracing.tracer.lay_out_placeholders(step.traced.split_placeholders)
report = {"made": len(made), "without_buffer": sum(torch_xla._XLAC._is_placecholder(t) for t in made),
          "split_gradients": [b.name for b in step.arguments if b.name.startswith("grad_") and b.spec]}
hlo = capture.capture_partitioned_hlo(session, step.output_tensors())
entry = hlo[hlo.rindex("\nENTRY "):]
parameters = re.findall(r"= (\w+\[[\d,]*\])\S* parameter\(\d+\)(.*)", entry)
report["split_shapes"] = sorted(shape for shape, rest in parameters if "sharding={devices=" in rest)
print(json.dumps(report))
sys.stdout.flush()
capture.end_process(session)
"""


def _report(script: str, *args: str) -> dict:
    """Run ``script`` in its own process (one trace per process); the JSON of its last line."""
    completed = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO_ROOT, capture_output=True,
                               text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.trace
@pytest.mark.slow
def test_compile_only_trace_holds_no_buffer_and_splits_its_parameters():
    report = _report(SCRIPT)
    assert report["tensors"] > 22 and report["without_buffer"] == report["tensors"]
    assert report["split_made"] == 22
    split = report["split_shapes"]
    assert len(split) == 22  # every split tensor is a split parameter of the partitioned program
    assert report["parameters"] > len(split)  # the replicated ones stay whole
    # per block: the qkv weight, rows of 192 / 4; fc1's (256, 64) rows and fc2's (64, 256)
    # columns; the proj weights' (64, 64) columns, self- and cross-attention
    assert split.count("bf16[48,64]") == 2
    assert split.count("bf16[64,64]") == 4
    assert split.count("bf16[64,16]") == 4


@pytest.mark.trace
@pytest.mark.slow
def test_a_compile_only_training_step_holds_no_gradient_buffer(tmp_path):
    from test_tracing_strategies import TINY3_TOML

    config = tmp_path / "tiny3.toml"
    config.write_text(TINY3_TOML)
    report = _report(TRAIN_SCRIPT, str(config))
    assert "grad_x" in report["split_gradients"]
    assert report["made"] > 0 and report["without_buffer"] == report["made"]
    assert report["split_shapes"].count("bf16[2,64,64]") == 2  # x and grad_x, both split
