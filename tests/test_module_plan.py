"""trace-module's plans, inputs and model paths, read before torch is imported: each bad input is
one ``Error:`` line and exit code 2 (no torch needed for these)."""

from __future__ import annotations

import pytest

from hlo_trace.cli import run_click
from plans.module_plan import (
    PlanError,
    check_spec,
    dump_stem,
    load_plan,
    parse_input,
    resolve_spec,
    shorthand_rules,
)
from tracing.module_cli import main as trace_module


def run(args, capsys):
    code = run_click(trace_module, [str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("args, message", [
    (["models.zoo.gpt2", "--input", "ids=2x16:int64", "--strategy", "dp", "--mesh", "2x2"],
     "expected an import path pkg.module:factory"),
    (["models.zoo.gpt2:gpt2", "--input", "ids=2x16", "--strategy", "dp", "--mesh", "2x2"],
     "expected NAME=SHAPE:DTYPE"),
    (["models.zoo.gpt2:gpt2", "--input", "ids=2x16:complex64", "--strategy", "dp", "--mesh", "2x2"],
     "dtype 'complex64'"),
    (["models.zoo.gpt2:gpt2", "--input", "ids=2x0:int64", "--strategy", "dp", "--mesh", "2x2"],
     "sizes must be 1"),
    (["models.zoo.gpt2:gpt2", "--input", "ids=2x16:int64", "--input", "ids=2x8:int64",
      "--strategy", "dp", "--mesh", "2x2"], "--input ids is given twice"),
    (["models.zoo.gpt2:gpt2", "--input", "ids=2x16:int64", "--mesh", "2x2"], "no sharding plan"),
    (["models.zoo.gpt2:gpt2", "--input", "ids=2x16:int64", "--strategy", "fsdp", "--mesh", "2x2"],
     "strategy 'fsdp': expected one of dp, megatron, sp"),
    (["models.zoo.gpt2:gpt2", "--input", "ids=2x16:int64", "--strategy", "dp"], "no mesh"),
    (["models.zoo.gpt2:gpt2", "--input", "ids=2x16:int64", "--strategy", "dp", "--mesh", "2by2"],
     "--mesh '2by2': expected sizes joined by x"),
    (["models.zoo.gpt2:gpt2", "--input", "ids=2x16:int64", "--strategy", "dp", "--mesh", "16x16"],
     "at most 64 devices"),
    (["models.zoo.gpt2:gpt2", "--input", "target=2x16:float32", "--strategy", "dp", "--mesh",
      "2x2", "--mode", "train"], "the input name 'target' is the loss's"),
])
def test_command_line_errors_are_one_line(capsys, tmp_path, args, message):
    code, out, err = run([*args, "-o", tmp_path], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err and err.startswith("Error: ")


@pytest.mark.parametrize("text, message", [
    ("[mesh\nshape = [2, 2]\n", "not valid TOML"),
    ("[mesh]\nshape = [2, 2]\naxes = [\"x\"]\n", "do not name the 2 dimensions"),
    ("[mesh]\nshape = [2, 2]\n[[parameters]]\npattern = \"fc.weight\"\nspec = [\"z\", \"none\"]\n",
     "spec names axis 'z'"),
    ("[mesh]\nshape = [2, 2]\n[[parameters]]\npattern = \"fc.weight\"\nspec = [\"x\", \"x\"]\n",
     "uses a mesh axis twice"),
    ("[mesh]\nshape = [2, 2]\n[[parameters]]\npattern = \"fc.weight\"\n", "spec = None"),
    ("[mesh]\nshape = [2, 2]\n[[parameters]]\npattern = \"re:(\"\nspec = [\"x\"]\n",
     "not a regular expression"),
    ("[mesh]\nshape = [2, 2]\n[[activations]]\nmodule = \"fc\"\nspec = [\"x\"]\nwhere = \"inside\"\n",
     "where = 'inside': expected output or input"),
    ("[mesh]\nshape = [2, 2]\n[[inputs]]\nname = \"ids\"\nspec = [\"x\"]\nwhere = \"output\"\n",
     "unknown key 'where'"),
    ("layers = 3\n[mesh]\nshape = [2, 2]\n", "unknown key 'layers'"),
    ("[mesh]\nshape = [2, 2]\nlayers = 3\n", "mesh: unknown key 'layers'"),
    ("[mesh]\nshape = [0, 2]\n", "every size must be at least 1"),
])
def test_plan_file_errors_are_one_line(capsys, tmp_path, text, message):
    plan = write(tmp_path, "plan.toml", text)
    code, out, err = run(["models.zoo.gpt2:gpt2", "--input", "ids=2x16:int64", "--plan", plan,
                          "-o", tmp_path], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err and "plan.toml" in err


def test_a_kwargs_file_that_is_no_toml_is_one_line(capsys, tmp_path):
    kwargs = write(tmp_path, "model.toml", "hidden = \n")
    code, _, err = run(["models.zoo.gpt2:gpt2", "--kwargs", kwargs, "--input", "ids=2x16:int64",
                        "--strategy", "dp", "--mesh", "2x2", "-o", tmp_path], capsys)
    assert code == 2 and "model.toml: not valid TOML" in err


def test_an_existing_dump_is_not_overwritten(capsys, tmp_path):
    (tmp_path / "gpt2_dp_2x2.mlir").write_text("module {}\n")
    code, _, err = run(["models.zoo.gpt2:gpt2", "--input", "ids=2x16:int64", "--strategy", "dp",
                        "--mesh", "2x2", "-o", tmp_path], capsys)
    assert code == 2 and "already exists; pass --force" in err


def test_a_plan_file_reads_into_rules_and_the_mesh_option_wins(tmp_path):
    plan = write(tmp_path, "p.toml", """
strategy = "megatron"
[mesh]
shape = [2, 2]
axes = ["data", "model"]
[[parameters]]
pattern = "blocks.*.fc1.weight"
spec = ["model", "none"]
[[inputs]]
name = "x"
spec = [["data", "model"], "none"]
[[activations]]
module = "re:blocks\\\\.[0-9]+\\\\.fc2"
spec = ["none", "model"]
where = "input"
then = ["model", "none"]
""")
    loaded = load_plan(str(plan), shorthand=None, mesh="1x4")
    assert loaded.mesh_shape == (1, 4) and loaded.axes == ("data", "model")
    assert loaded.parameter_spec("blocks.3.fc1.weight") == ("model", None)
    assert loaded.parameter_spec("blocks.3.fc2.weight") == (None, ("data", "model"))  # shorthand
    assert loaded.input_spec("x") == (("data", "model"), None)
    rules = loaded.activation_rules("blocks.12.fc2")
    assert [(r.where, r.spec, r.then) for r in rules][0] == ("input", (None, "model"), ("model", None))
    assert loaded.shorthand == "megatron" and loaded.devices == 4


def test_the_shorthands_split_what_their_names_say():
    sp = shorthand_rules("sp", ("x", "y"))
    assert resolve_spec(sp["inputs"][0].spec, (1, 16)) == (None, ("x", "y"))
    dp = shorthand_rules("dp", ("y",))
    assert resolve_spec(dp["inputs"][0].spec, (8, 3, 32, 32)) == ("y", None, None, None)
    megatron = shorthand_rules("megatron", ("x", "y"))
    column = [r for r in megatron["parameters"] if r.matches("layers.0.self_attn.q_proj.weight")]
    row = [r for r in megatron["parameters"] if r.matches("h.1.mlp.c_proj.weight")]
    assert column[0].spec == (("x", "y"), None) and row[0].spec == (None, ("x", "y"))
    assert not any(r.matches("layers.0.self_attn.q_proj.weight") for r in megatron["parameters"]
                   if r.spec == (None, ("x", "y")))  # "proj" is not "q_proj"


def test_a_spec_that_the_mesh_does_not_divide_is_refused():
    with pytest.raises(PlanError, match="dimension 0 of shape \\[6, 4\\] is 6, not divisible by "
                                        "the 4 devices of mesh axes x, y"):
        check_spec((("x", "y"), None), (6, 4), "parameter w", {"x": 2, "y": 2})
    with pytest.raises(PlanError, match="has 1 entries for a tensor of shape"):
        check_spec(("x",), (6, 4), "parameter w", {"x": 2, "y": 2})


def test_inputs_and_names():
    assert parse_input("images=4x3x32x32:float32").shape == (4, 3, 32, 32)
    assert parse_input("t=scalar:float32").shape == ()
    plan = load_plan(None, shorthand="dp", mesh="2x2")
    assert dump_stem("models.zoo.gpt2:gpt2", plan, "infer", None) == "gpt2_dp_2x2"
    assert dump_stem("my.pkg.nets:make_net", plan, "train", None) == "nets_make_net_dp_2x2_train"
    assert dump_stem("models.zoo.convnet:convnet", plan, "infer",
                     "plans/convnet_megatron.toml") == "convnet_megatron_2x2"
