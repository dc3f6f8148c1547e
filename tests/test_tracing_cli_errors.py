"""Bad input to trace-stage: one line ``Error: ...``, exit code 2, no traceback, no file left.

These fail before torch-xla starts, so they run in-process through click's CliRunner.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from plans.config import PipelineConfigError, build_config, parse_mesh, parse_stage_ids
from tracing.cli import main

TINY = ["--config", "tiny", "--mesh", "2x2"]


def run(args: list[str]):
    return CliRunner().invoke(main, args)


def assert_usage_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("args, fragments", [
    (["--strategy", "zigzag"], ("unknown strategy 'zigzag'", "megatron")),
    (["--strategy", "megatron", "--devices", "8"], ("--devices 8", "2x2")),
    (["--strategy", "megatron", "--mesh", "2x4"], ("heads = 4", "8 devices")),
    (["--strategy", "two_dimension", "--mesh", "1x8"], ("heads = 4",)),
    (["--strategy", "dp"], ("batch = 2", "4 devices")),
    (["--strategy", "two_dimension", "--mesh", "4x1"], ("batch = 2",)),
    (["--strategy", "none"], ("one device", "1x1")),
    (["--strategy", "usp", "--mesh", "2x4", "--ring-degree", "3"],
     ("ring degree x Ulysses degree", "4 devices of mesh axis y", "ring 3")),
    (["--strategy", "usp", "--mesh", "2x4", "--ring-degree", "4", "--ulysses-degree", "2"],
     ("ring degree x Ulysses degree", "ring 4 x ulysses 2")),
    (["--strategy", "usp", "--mesh", "1x8", "--ulysses-degree", "8"], ("heads = 4", "ulysses degree 8")),
    (["--strategy", "usp", "--ring-degree", "0"], ("--ring-degree", "must be at least 1")),
    (["--strategy", "megatron", "--stage", "3", "--stage-ids", "0-0,1-1"], ("stage 3", "0..1")),
    (["--strategy", "megatron", "--stage-ids", "0-0,2-3"], ("stage 1 starts at block 2",)),
    (["--strategy", "megatron", "--mesh", "2by2"], ("bad mesh",)),
    (["--strategy", "megatron", "--shape", "204x640"], ("bad video shape",)),
    (["--strategy", "megatron", "--config", "huge"], ("unknown model config",)),
])
def test_bad_options(tmp_path, args, fragments):
    result = run([*TINY, *args, "-o", str(tmp_path)])
    assert_usage_error(result, *fragments)
    assert list(tmp_path.iterdir()) == []


def test_output_path_that_is_a_file(tmp_path):
    blocker = tmp_path / "dumps"
    blocker.write_text("not a directory")
    result = run([*TINY, "--strategy", "megatron", "-o", str(blocker)])
    assert_usage_error(result, "exists and is not a directory")
    assert blocker.read_text() == "not a directory"


def test_output_directory_under_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run([*TINY, "--strategy", "megatron", "-o", str(blocker / "dumps")])
    assert_usage_error(result, "cannot create the output directory")


def test_unwritable_output_directory(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    target = locked if not os.access(locked, os.W_OK) else Path("/proc/self")  # root ignores modes
    try:
        result = run([*TINY, "--strategy", "megatron", "-o", str(target)])
    finally:
        locked.chmod(0o755)
    assert_usage_error(result, "not writable")
    assert list(locked.iterdir()) == []


def test_existing_dump_needs_force(tmp_path):
    existing = tmp_path / "tiny_28_64_64_megatron_2x2_stage0_pairs0-1.mlir"  # one stage, pairs 0-1
    existing.write_text("old dump")
    result = run([*TINY, "--strategy", "megatron", "-o", str(tmp_path)])
    assert_usage_error(result, "already exists", "--force")
    assert existing.read_text() == "old dump"
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing.name]


def test_help_lists_every_option_with_default():
    result = run(["--help"])
    assert result.exit_code == 0
    for option in ("--stage", "--strategy", "--shape", "--mesh", "--stage-ids", "--config",
                   "--dialect", "--out", "--force", "--check", "--pipeline", "--batch"):
        assert option in result.output
    assert "default: 2x8" in result.output and "two_dimension" in result.output


def test_config_parsing():
    assert parse_mesh("2x8") == (2, 8)
    assert parse_stage_ids("0-13,14-27") == ((0, 13), (14, 27))
    config = build_config(config="full", strategy="megatron", mesh="2x8", stage_ids="0-13,14-27")
    assert config.shape == "204_640_360" and config.num_devices == 16
    assert config.submesh(1).global_device_ids((2, 8))[0][:2] == [0, 1]
    with pytest.raises(PipelineConfigError):
        build_config(config="full", stage_ids="0-13,14-26")


def test_pipeline_file(tmp_path):
    from plans.config import load_config_file

    path = tmp_path / "pipe.toml"
    path.write_text('config = "tiny"\nstrategy = "megatron"\nmesh_shape = [2, 4]\n'
                    'stage_ids = [[0, 0], [1, 1]]\nsubmeshes = [[2, 2, 0, 0], [2, 2, 0, 2]]\n')
    config = load_config_file(path)
    assert config.submesh(1).global_device_ids(config.mesh_shape) == [[2, 3], [6, 7]]
    assert load_config_file(path, strategy="dp").strategy == "dp"
    path.write_text('config = "tiny"\nsubmeshes = [[2, 2, 1, 3]]\nmesh_shape = [2, 4]\n')
    with pytest.raises(PipelineConfigError, match="does not fit"):
        load_config_file(path)


def test_without_the_trace_extra_a_trace_says_what_to_install(tmp_path):
    import importlib.util

    if importlib.util.find_spec("torch_xla") is not None:
        pytest.skip("the trace extra is installed: this checks the light install")
    result = run([*TINY, "--strategy", "megatron", "-o", str(tmp_path)])
    assert_usage_error(result, "not installed", 'pip install -e ".[trace]"')
    assert list(tmp_path.iterdir()) == []


def test_help_works_without_importing_torch():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; sys.modules['torch_xla'] = None\n"
            "from tracing.cli import main; main(['--help'])")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               cwd=Path(__file__).resolve().parent.parent)
    assert completed.returncode == 0, completed.stderr
    assert "--strategy" in completed.stdout and "megatron" in completed.stdout
