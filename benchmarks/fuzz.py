"""Fuzz the project's seven commands with seeded mutations of the bundled inputs and options.

Seeds: every dump in ``dumps/`` and ``hlo_trace/examples/`` (StableHLO, MHLO, HLO text), every hardware TOML in
``hardware/data/``, a model and a pipeline TOML of ``trace-stage``, the report pages' JSON (made
by analyze-hlo and analyze-pipeline from the tiny dumps; a committed plan search) and the
study's CSV tables (``results/``). Each case mutates one seed
(bytes, lines, numbers, attributes, replica groups, element types, string escapes, nesting depth,
option values) and runs it:

* dumps and hardware files: ``analyze-hlo`` (``run_click`` on the real command) in a forked
  child with its memory capped (``RLIMIT_AS``), its output in files and a wall-clock limit;
* trace-stage TOMLs: the loaders ``plans.config.load_config_file`` / ``get_config`` in the
  same kind of child (a valid file must load, a bad one must raise a one-line UsageError;
  nothing is traced);
* MLIR bytecode (the dumps written as bytecode, then bytes flipped, strings made non-UTF-8 or
  counts changed): ``analyze-hlo``;
* sidecars (a dump's JSON sidecar with a field replaced, removed or nested 2,000 deep):
  ``analyze-hlo --sidecar`` and ``analyze-pipeline`` on the two pipeline stages;
* nested documents (a 50- to 5,000-deep TOML array or JSON list) given to every reader:
  ``--hw``, ``--config``, ``--pipeline``, analyze-pipeline's TOML, ``--sidecar``;
* numbers in options (NaN, infinities, Unicode digits, 5,000-digit integers);
* interrupts: a command (``python3 -m ...`` in a fresh process) sent SIGINT at a random moment
  of its first 2.5 s, start-up included (``Interrupted.`` and exit code 130, or a finished run);
* ``plan-search --scheduler`` at addresses of other kinds and at listeners that are no Dask
  scheduler (one that never answers, one that answers as an HTTP server);
* report pages: ``hlo-report analysis`` / ``pipeline`` / ``plan`` on a mutated JSON (a field at
  any depth replaced by a 401-digit integer, 1.79e308, a lone surrogate, a list, markup such as
  ``<b>``, or removed; bytes flipped) and ``hlo-report study`` on the study's tables with one CSV
  cell replaced; a page written must show names as text (no ``<b>``/``<a`` in its figures);
* ``trace-module`` (a fresh process) on odd factories and forwards (returning nothing, reading a
  value back, raising ``SystemExit``/``BaseException``/``KeyboardInterrupt``, a factory that
  returns no module), the zoo's GPT-2 and odd options (``--input`` sizes and dtypes, ``--mesh``,
  ``--strategy``, ``--mode train``, ``--dtype``, ``--name``);
* ``plan-search`` options around a training search (``--mode train --estimate ideal
  --no-confirm``: seconds) and its sizing: ``--plot``, ``-o``, ``--json``, batch, micro-batches,
  ZeRO stages, targets, device counts; a run that exits 0 must have written what was asked;
* terminations: a trace command (trace-stage, trace-module, trace-vae-decode) sent SIGTERM at a
  random moment of its first 4 s (it ends by the signal, or finished).

Every case runs in its own process group with its own temporary directory (``TMPDIR``): a
process of it left running once it ended is an ``orphan``; an ``hlo_trace_xla_dump_*`` folder
left in its temporary directory is ``leaked-temp``; a run whose peak resident memory passed
4 GiB is counted (``over-4GiB``).

Every outcome falls in one class; the error promise is that only ``ok`` and ``usage`` occur:

* ``ok``: exit 0, and a JSON report holds no negative, NaN or infinite number;
* ``usage``: exit 2 and exactly one line ``Error: ...`` on stderr;
* ``interrupted``: an interrupt case that printed ``Interrupted.`` and exited with 130;
* ``terminated``: a termination case that ended by SIGTERM;
* ``no-answer``: plan-search's documented exit code 3 (docs/plan_search.md): its report says
  that no plan fits or no device count meets the target, with no ``Error:`` line;
* ``interpreter-start``: an interrupt that came while the interpreter itself started (its
  ``site`` module: "Fatal Python error: init_import_site"), before any code of the command;
* ``internal`` (exit 1), ``signal`` (died of a signal), ``hang`` (over the time limit),
  ``messy`` (exit 2 but not one ``Error:`` line, or a traceback), ``bad-numbers`` (exit 0 with a
  negative/NaN/inf number), ``orphan`` (a process of the case still running after it ended),
  ``leaked-temp`` (an ``hlo_trace_xla_dump_*`` folder left behind), ``markup`` (a page whose
  figures hold ``<b>`` or ``<a`` from a name), ``unwritten`` (exit 0 without an output it was
  asked for), ``other`` (any other exit code).

    python3 benchmarks/fuzz.py --cases 5000 --seed 1 --log results/fuzz/fuzz_5000.txt
        [--jobs 2] [--timeout 60] [--memory-mb 4000]
    python3 benchmarks/fuzz.py --quick    # 12 cases (seconds): what CI runs besides tests/test_fuzz.py

Prints (and with ``--log`` writes) the command, seed, date, the count per class, per command and
per mutator, cases per minute, and the first examples of every failing class.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from planning.plan_search_cli import NO_ANSWER  # noqa: E402  (imports no torch)

GOOD_CLASSES = ("ok", "usage", "interrupted", "interpreter-start", "terminated", "no-answer")
CLASSES = (*GOOD_CLASSES, "internal", "signal", "hang", "messy", "bad-numbers", "orphan",
           "leaked-temp", "markup", "unwritten", "other")
#: The folders XLA's dumps go to while a trace runs (tracing.capture): none may outlive it.
LEAK_GLOB = "hlo_trace_xla_dump_*"
#: The project's commands (pyproject.toml's [project.scripts]), each case counted under one.
COMMAND_NAMES = ("analyze-hlo", "analyze-pipeline", "hlo-report", "plan-search", "trace-module",
                 "trace-stage", "trace-vae-decode")
#: Address space of a case run as a fresh command (torch and XLA map ~5 GB of it).
EXEC_ADDRESS_SPACE_BYTES = 16 * 2**30
#: Peak resident memory of a case counted as too much (the issue's bound).
MEMORY_BOUND_BYTES = 4 * 2**30

# --------------------------------------------------------------------------------------------
# Seeds
# --------------------------------------------------------------------------------------------


def dump_seeds() -> list[Path]:
    """The tiny STDiT3 dumps of ``dumps/`` and the bundled example (``hlo_trace/examples/``)."""
    dumps, examples = REPO_ROOT / "dumps", REPO_ROOT / "hlo_trace" / "examples"
    return sorted([*dumps.glob("*/*.mlir"), *examples.glob("*.mlir"), *examples.glob("*.hlo.txt")])


def hardware_seeds() -> list[Path]:
    return sorted((REPO_ROOT / "hardware" / "data").glob("*.toml"))


#: A tiny STDiT3 dump that segments into blocks, for the hardware mutations (--hw FILE).
HW_DUMP = REPO_ROOT / "dumps" / "stablehlo"
MODEL_SEED = """hidden_size = 64
depth = 2
num_heads = 4
mlp_ratio = 4.0
patch_size = [1, 2, 2]
caption_channels = 32
model_max_length = 8
qk_norm = true
norm_eps = 1e-6
"""
PIPELINE_SEED = """config = "tiny"
shape = "28_64_64"
strategy = "megatron"
mesh_shape = [2, 2]
stage_ids = [[0, 0], [1, 1]]
submeshes = [[2, 2, 0, 0], [2, 2, 0, 0]]
dtype = "bfloat16"
batch = 2
"""

# --------------------------------------------------------------------------------------------
# Mutators: (text, rng) -> text. Each changes one thing; the name says what.
# --------------------------------------------------------------------------------------------

INTERESTING_NUMBERS = ["0", "-1", "1", "2", "3", "7", "-7", "65536", "2147483647", "2147483648",
                       "4294967296", "9223372036854775807", "9223372036854775808",
                       "18446744073709551616", "100000000000000000000", "1e400", "-0", "1.5"]
ELEMENT_TYPES = ["f32", "bf16", "f16", "f64", "i1", "i8", "i32", "i64", "ui8", "ui64",
                 "f8E4M3FN", "f8E5M2", "f4E2M1FN", "i2", "i4", "complex<f32>", "index"]
NUMBER = re.compile(r"(?<![A-Za-z_#%@.])\d+")
DIM = re.compile(r"tensor<((?:\d+x)+)")


def flip_bytes(text: str, rng: random.Random) -> str:
    data = bytearray(_encode(text))
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return data.decode("utf-8", errors="surrogateescape")


def printable_noise(text: str, rng: random.Random) -> str:
    position = rng.randrange(len(text))
    noise = "".join(rng.choice("(){}[]<>:,=%@^\"x0123456789 ") for _ in range(rng.randint(1, 6)))
    return text[:position] + noise + text[position:]


def delete_line(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    del lines[rng.randrange(len(lines))]
    return "\n".join(lines) + "\n"


def duplicate_line(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    index = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines)), lines[index])
    return "\n".join(lines) + "\n"


def swap_lines(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[a], lines[b] = lines[b], lines[a]
    return "\n".join(lines) + "\n"


def truncate(text: str, rng: random.Random) -> str:
    return text[:rng.randrange(len(text))]


def replace_number(text: str, rng: random.Random) -> str:
    matches = list(NUMBER.finditer(text))
    if not matches:
        return text
    for match in rng.sample(matches, min(len(matches), rng.randint(1, 3))):
        text = text[:match.start()] + rng.choice(INTERESTING_NUMBERS) + text[match.end():]
        break  # offsets of the other matches moved; one replacement per pass
    return text


def replace_dimension(text: str, rng: random.Random) -> str:
    matches = list(DIM.finditer(text))
    if not matches:
        return text
    match = rng.choice(matches)
    dims = match.group(1)[:-1].split("x")
    dims[rng.randrange(len(dims))] = rng.choice(["0", "1", "3", "1000000007", "4294967296",
                                                 "9223372036854775807"])
    return text[:match.start(1)] + "x".join(dims) + "x" + text[match.end(1):]


def num_partitions(text: str, rng: random.Random) -> str:
    value = rng.choice(["true", "false", "0 : i32", "-3 : i32", "4.5 : f32", '"4"', "[4]",
                        "1 : i1", "4294967295 : ui32", "9223372036854775807 : i64",
                        "2 : i32", "64 : i64", "unit"])
    replaced, count = re.subn(r"mhlo\.num_partitions = [^,}]+",
                              lambda _: f"mhlo.num_partitions = {value}", text, count=1)
    return replaced if count else text.replace("num_partitions=", f"num_partitions={value}", 1)


def replica_groups(text: str, rng: random.Random) -> str:
    value = rng.choice([
        "dense<> : tensor<0x4xi64>", "dense<> : tensor<0x0xi64>", "dense<> : tensor<4x0xi64>",
        "dense<[[0, 0]]> : tensor<1x2xi64>", "dense<[[0, 99]]> : tensor<1x2xi64>",
        "dense<[[-1, 1]]> : tensor<1x2xi64>", "dense<0> : tensor<1x1xi64>",
        "dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>", "dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>",
        "dense<[[9223372036854775807, 0]]> : tensor<1x2xi64>"])
    replaced, count = re.subn(r"replica_groups = dense<[^:]*> : tensor<[0-9x]+xi64>",
                              lambda _: f"replica_groups = {value}", text, count=1)
    return replaced if count else replace_number(text, rng)


def element_type(text: str, rng: random.Random) -> str:
    source = rng.choice(["xf32>", "xbf16>", "<f32>", "<bf16>", "xi32>", "xi64>"])
    if source not in text:
        return text
    target = rng.choice(ELEMENT_TYPES)
    prefix = source[0]
    positions = [m.start() for m in re.finditer(re.escape(source), text)]
    position = rng.choice(positions)
    return text[:position] + f"{prefix}{target}>" + text[position + len(source):]


def swap_op_name(text: str, rng: random.Random) -> str:
    names = sorted(set(re.findall(r"\b(?:stablehlo|mhlo)\.[a-z_]+\b", text)))
    if len(names) < 2:
        return text
    a, b = rng.sample(names, 2)
    positions = [m.start() for m in re.finditer(re.escape(a) + r"\b", text)]
    position = rng.choice(positions)
    return text[:position] + b + text[position + len(a):]


def bad_escape(text: str, rng: random.Random) -> str:
    escape = rng.choice(["\\AF", "\\FF\\FE", "\\C3", "\\E2\\82", "\\00", "\\C3\\A9", "\\\\AF"])
    marker = 'loc("' if 'loc("' in text else '"'
    return text.replace(marker, marker + escape, 1)


def nest_regions(text: str, rng: random.Random) -> str:
    """A module of ``depth`` nested ``case`` regions (the depth kills parsers and recursive
    walks); ignores the seed."""
    return nested_module(rng.choice([50, 100, 200, 500, 1000, 2000, 5000]))


def nested_module(depth: int) -> str:
    """A module of ``depth`` nested ``case`` regions (thousands overflow the MLIR parser's stack)."""
    lines = ["module {", "  func.func @main(%a: tensor<f32>, %i: tensor<i32>) -> tensor<f32> {"]
    for d in range(depth, 0, -1):
        lines.append(f'%v{d} = "stablehlo.case"(%i) ({{')
    lines.append("stablehlo.return %a : tensor<f32>")
    for d in range(1, depth + 1):
        lines.append("}) : (tensor<i32>) -> tensor<f32>")
        if d < depth:
            lines.append(f"stablehlo.return %v{d} : tensor<f32>")
    lines += [f"    return %v{depth} : tensor<f32>", "  }", "}"]
    return "\n".join(lines) + "\n"


def call_chain(text: str, rng: random.Random) -> str:
    """Private functions each calling the next twice (exponential if walked naively); ignores
    the seed."""
    depth = rng.choice([5, 10, 20, 25])
    lines = ["module {"]
    for d in range(depth):
        lines += [f"  func.func private @f{d}(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {{",
                  f"    %a = call @f{d + 1}(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32>",
                  f"    %b = call @f{d + 1}(%a) : (tensor<4x4xf32>) -> tensor<4x4xf32>",
                  "    return %b : tensor<4x4xf32>", "  }"]
    lines += [f"  func.func private @f{depth}(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {{",
              "    %y = stablehlo.dot %x, %x : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>",
              "    return %y : tensor<4x4xf32>", "  }",
              "  func.func @main(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {",
              "    %y = call @f0(%x) : (tensor<4x4xf32>) -> tensor<4x4xf32>",
              "    return %y : tensor<4x4xf32>", "  }", "}"]
    return "\n".join(lines) + "\n"


DUMP_MUTATORS: dict[str, Callable[[str, random.Random], str]] = {
    "flip-bytes": flip_bytes, "noise": printable_noise, "delete-line": delete_line,
    "duplicate-line": duplicate_line, "swap-lines": swap_lines, "truncate": truncate,
    "number": replace_number, "dimension": replace_dimension, "num-partitions": num_partitions,
    "replica-groups": replica_groups, "element-type": element_type, "op-name": swap_op_name,
    "escape": bad_escape, "nesting": nest_regions, "call-chain": call_chain,
}

TOML_VALUES = ['nan', 'inf', '-inf', '"nan GB/s"', '"1e400 GB/s"', '"1e-320 GB/s"', '"1e-320 us"',
               '"-5 TFLOPS"', '"0 B"', '"1e30 TFLOPS"', '"5e-324 s"', '0', '-1', '1099511627776',
               '"x"', 'true', '[1, 2]', '2.5', '"4x4"', '"0x0"', '"1099511627776x1"', '"3 MiB"',
               '"100 GB/s"', '"mesh"', '"crossbar"', '"ring"', '"1 B"', '"1 KiB"', '"0.01 us"']


def toml_value(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    keyed = [i for i, line in enumerate(lines) if re.match(r"^\s*[a-z_]+\s*=", line)]
    index = rng.choice(keyed)
    key = lines[index].split("=", 1)[0].strip()
    lines[index] = f"{key} = {rng.choice(TOML_VALUES)}"
    return "\n".join(lines) + "\n"


def toml_delete_key(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    keyed = [i for i, line in enumerate(lines) if re.match(r"^\s*[a-z_]+\s*=", line)]
    del lines[rng.choice(keyed)]
    return "\n".join(lines) + "\n"


def toml_tile_count(text: str, rng: random.Random) -> str:
    count = rng.choice(["1099511627776", "1048577", "1048576", "65536", "0", "17"])
    grid = rng.choice([f'"{count}x1"', '"4x4"', '"1024x1024"'])
    text = re.sub(r"(?m)^(tile_count|chip_count)\s*=.*$", lambda m: f"{m[1]} = {count}", text)
    return re.sub(r"(?m)^(tile_grid|topology_grid)\s*=.*$", lambda m: f"{m[1]} = {grid}", text)


TOML_MUTATORS: dict[str, Callable[[str, random.Random], str]] = {
    "toml-value": toml_value, "toml-delete": toml_delete_key, "toml-tiles": toml_tile_count,
    "toml-noise": printable_noise, "toml-flip": flip_bytes,
}

OPTION_VALUES = {
    "--link-bandwidth": ["nan", "inf", "-1", "0", "1e-320", "1e308", "5e-324", "100", "x"],
    "--hop-latency": ["nan", "-1", "0", "1e308", "1"],
    "--steps": ["0", "-1", "1", "30", "1000000", "1000001", "9" * 400],
    "--blocks": ["0", "1", "28", "9" * 40],
    "--format": ["json", "csv", "table", "xml"],
    "--by": ["op", "category", "block", "row"],
}


def random_options(rng: random.Random) -> list[str]:
    options = ["--format", "json"]
    for name in rng.sample(sorted(OPTION_VALUES), rng.randint(0, 2)):
        options += [name, rng.choice(OPTION_VALUES[name])]
    if rng.random() < 0.1:
        options.append("--bruck")
    return options


# --------------------------------------------------------------------------------------------
# Cases and outcomes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One input: a mutated file and how to run it."""

    index: int
    #: "dump", "bytecode", "hardware", "model", "pipeline", "sidecar", "stage-sidecar",
    #: "nested", "option", "interrupt", "scheduler", "report", "report-csv", "module", "plan",
    #: "terminate"
    kind: str
    mutator: str
    seed_name: str
    content: bytes
    options: tuple[str, ...] = ()
    #: A command run in a fresh process (``python3 -m ...``) instead of in the forked child.
    argv: tuple[str, ...] = ()
    #: Seconds after its start at which the case is sent SIGINT (interrupt cases) or SIGTERM
    #: (terminate cases).
    interrupt_after: float | None = None

    @property
    def command(self) -> str:
        """The project command the case runs (one of COMMAND_NAMES)."""
        if self.seed_name in COMMAND_NAMES:  # option, interrupt, terminate, module, plan cases
            return self.seed_name
        if self.kind in ("report", "report-csv"):
            return "hlo-report"
        if self.kind == "scheduler":
            return "plan-search"
        if self.kind in ("model", "pipeline"):
            return "trace-stage"  # its TOML loaders
        if self.kind == "stage-sidecar" or (self.kind == "nested" and self.options[0] in (
                "pipeline-analysis",)):
            return "analyze-pipeline"
        if self.kind == "nested" and self.options[0] in ("model", "pipeline"):
            return "trace-stage"
        return "analyze-hlo"


@dataclass
class Outcome:
    case: Case
    klass: str
    exit_code: int | None
    seconds: float
    stderr_tail: str = ""
    peak_rss_bytes: int = 0


@dataclass
class Tally:
    by_class: Counter = field(default_factory=Counter)
    by_mutator: dict[str, Counter] = field(default_factory=dict)
    by_command: dict[str, Counter] = field(default_factory=dict)
    examples: dict[str, list[Outcome]] = field(default_factory=dict)
    over_memory: int = 0
    slowest_s: float = 0.0
    seconds_by_kind: Counter = field(default_factory=Counter)

    def add(self, outcome: Outcome) -> None:
        self.by_class[outcome.klass] += 1
        self.over_memory += outcome.peak_rss_bytes > MEMORY_BOUND_BYTES
        self.slowest_s = max(self.slowest_s, outcome.seconds)
        self.seconds_by_kind[outcome.case.kind] += outcome.seconds
        self.by_mutator.setdefault(outcome.case.mutator, Counter())[outcome.klass] += 1
        self.by_command.setdefault(outcome.case.command, Counter())[outcome.klass] += 1
        if outcome.klass not in GOOD_CLASSES:
            self.examples.setdefault(outcome.klass, []).append(outcome)

    @property
    def failures(self) -> int:
        return sum(count for klass, count in self.by_class.items() if klass not in GOOD_CLASSES)


def make_cases(count: int, seed: int) -> Iterator[Case]:
    """``count`` cases drawn with ``random.Random(seed)``: 36% text dumps, 8% bytecode, 8%
    hardware files, 4% trace-stage TOMLs, 7% sidecars, 5% stage sidecars, 4% nested documents,
    4% option numbers, 10% report JSON, 3% study CSV, 3% plan-search options, 2.5%
    trace-module, 3% interrupts, 1% terminations, 1.5% scheduler addresses (the torch-heavy
    kinds, trace-module, interrupts and terminations of traces, stay a few percent: each takes
    seconds)."""
    rng = random.Random(seed)
    dumps = [(path, path.read_text()) for path in dump_seeds()]
    hardware = [(path, path.read_text()) for path in hardware_seeds()]
    bytecodes: list[tuple[Path, bytes]] | None = None
    for index in range(count):
        roll = rng.random()
        if roll < 0.36:
            path, text = rng.choice(dumps)
            name = rng.choice(sorted(DUMP_MUTATORS))
            mutated = _mutate(DUMP_MUTATORS[name], text, rng)
            if rng.random() < 0.3:  # sometimes two mutations
                second = rng.choice(sorted(DUMP_MUTATORS))
                mutated, name = _mutate(DUMP_MUTATORS[second], mutated, rng), f"{name}+{second}"
            options = random_options(rng) if rng.random() < 0.3 else ["--format", "json"]
            yield Case(index, "dump", name, path.name, _encode(mutated), tuple(options))
        elif roll < 0.44:
            bytecodes = bytecodes if bytecodes is not None else bytecode_seeds()
            path, raw = rng.choice(bytecodes)
            name = rng.choice(sorted(BYTECODE_MUTATORS))
            yield Case(index, "bytecode", name, path.name, BYTECODE_MUTATORS[name](raw, rng),
                       ("--format", "json") if rng.random() < 0.7 else ("--hw", "tx8"))
        elif roll < 0.52:
            path, text = rng.choice(hardware)
            name = rng.choice(sorted(TOML_MUTATORS))
            yield Case(index, "hardware", name, path.name, _encode(_mutate(TOML_MUTATORS[name], text, rng)))
        elif roll < 0.56:
            kind = rng.choice(["model", "pipeline"])
            text = MODEL_SEED if kind == "model" else PIPELINE_SEED
            name = rng.choice(["toml-value", "toml-delete", "toml-noise", "toml-flip"])
            yield Case(index, kind, name, f"{kind}.toml", _encode(_mutate(TOML_MUTATORS[name], text, rng)))
        elif roll < 0.63:
            name, content = mutate_sidecar(SIDECAR_SEED.read_text(), rng)
            yield Case(index, "sidecar", name, SIDECAR_SEED.name, content)
        elif roll < 0.68:
            stage = rng.randrange(len(PIPELINE_STAGES))
            name, content = mutate_sidecar(PIPELINE_STAGES[stage].with_suffix(".json").read_text(), rng)
            yield Case(index, "stage-sidecar", name, f"stage{stage}", content)
        elif roll < 0.72:
            reader = rng.choice(NESTED_READERS)
            depth = rng.choice([50, 64, 65, 200, 2000, 5000])
            yield Case(index, "nested", f"nested-{reader}", f"depth {depth}",
                       nested_document(reader, depth), (reader,))
        elif roll < 0.76:
            command, options = random_number_options(rng)
            yield Case(index, "option", f"option-{command}", command, b"", tuple(options))
        elif roll < 0.86:
            page = rng.choice(sorted(REPORT_PAGES))
            name, content = mutate_report(report_seed(page), rng)
            yield Case(index, "report", name, page, content)
        elif roll < 0.89:
            table = rng.choice(STUDY_TABLES)
            name, content = mutate_csv((REPO_ROOT / "results" / f"{table}.csv").read_text(), rng)
            yield Case(index, "report-csv", name, table, content)
        elif roll < 0.92:
            yield Case(index, "plan", "plan-search-options", "plan-search", b"",
                       tuple(plan_search_options(rng)))
        elif roll < 0.945:
            name, argv, module_source = trace_module_case(rng)
            yield Case(index, "module", name, "trace-module", module_source, argv=argv)
        elif roll < 0.975:
            command = rng.choice(sorted(INTERRUPT_COMMANDS))
            yield Case(index, "interrupt", f"interrupt-{command}", command, b"",
                       argv=INTERRUPT_COMMANDS[command],
                       interrupt_after=round(rng.uniform(0.05, 2.5), 3))
        elif roll < 0.985:
            command = rng.choice(sorted(TRACE_COMMANDS))
            yield Case(index, "terminate", f"terminate-{command}", command, b"",
                       argv=INTERRUPT_COMMANDS[command],
                       interrupt_after=round(rng.uniform(0.05, 4.0), 3))
        else:
            address = rng.choice(SCHEDULER_ADDRESSES)
            yield Case(index, "scheduler", f"scheduler-{address.split(':', 1)[0]}", address, b"",
                       argv=("planning.plan_search_cli", "--config", "tiny", "--devices", "4",
                             "--strategies", "megatron", "--stages", "1", "--budget", "1",
                             "--scheduler", address))


# --------------------------------------------------------------------------------------------
# Bytecode, sidecars, nested documents, numbers, interrupts and schedulers (issue 34)
# --------------------------------------------------------------------------------------------


def bytecode_seeds() -> list[tuple[Path, bytes]]:
    """The bundled tiny dumps written as MLIR bytecode by jaxlib's bindings (in a forked child:
    this process forks a child per case and must not run MLIR's thread pool itself)."""
    from hlo_trace.isolate import call_in_child

    paths = sorted((REPO_ROOT / "dumps" / "stablehlo").glob("*.mlir"))[:4]
    return [(path.with_suffix(".mlirbc"), call_in_child(_write_bytecode, path, origin=str(path)))
            for path in paths]


def _write_bytecode(path: Path) -> bytes:
    import io

    from hlo_analyzer.mlir import load_module, use_fresh_context

    use_fresh_context(threads=False)
    buffer = io.BytesIO()
    load_module(path).operation.write_bytecode(buffer)
    return buffer.getvalue()


def bytecode_flip(raw: bytes, rng: random.Random) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 6)):
        data[rng.randrange(16, len(data))] = rng.randrange(256)
    return bytes(data)


def bytecode_string(raw: bytes, rng: random.Random) -> bytes:
    """One byte of a string of the string section made 0xFF (not UTF-8)."""
    from hlo_analyzer.mlir import _bytecode_strings

    strings = _bytecode_strings(raw) or b""
    if not strings:
        return bytecode_flip(raw, rng)
    start = raw.rfind(strings)
    position = start + rng.randrange(len(strings))
    if raw[position] == 0:
        position += 1 if position + 1 < start + len(strings) else -1
    return raw[:position] + b"\xff" + raw[position + 1:]


def bytecode_count(raw: bytes, rng: random.Random) -> bytes:
    """A one-byte varint (an odd byte) made another small count, the length kept (a count of
    blocks, values, elements, an index)."""
    positions = [i for i in range(16, len(raw)) if raw[i] & 1]
    position = rng.choice(positions)
    return raw[:position] + bytes([rng.randrange(0, 128) << 1 | 1]) + raw[position + 1:]


def bytecode_truncate(raw: bytes, rng: random.Random) -> bytes:
    return raw[:rng.randrange(4, len(raw))]


BYTECODE_MUTATORS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "bc-flip": bytecode_flip, "bc-string": bytecode_string, "bc-count": bytecode_count,
    "bc-truncate": bytecode_truncate,
}

SIDECAR_SEED = HW_DUMP / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.json"
PIPELINE_DIR = REPO_ROOT / "dumps" / "pipeline"
PIPELINE_TOML = PIPELINE_DIR / "tiny_2x2_stages.toml"
PIPELINE_STAGES = [PIPELINE_DIR / "tiny_28_64_64_megatron_2x2_stage0_pairs0-0.mlir",
                   PIPELINE_DIR / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"]
SIDECAR_VALUES = [None, "x", 5, -1, 0, 1.5, True, [], {}, [-1, 8], ["x"], [[0, 1], ["x"]],
                  [1e300, 2], "nope", {"x": None}, 2**70, [2**63, 1], {"shape": [4], "dtype": "int64"}]


def mutate_sidecar(text: str, rng: random.Random) -> tuple[str, bytes]:
    """A sidecar with one field (at any depth) replaced, removed or nested deep; or its text
    mutated as bytes, or a non-finite number spelled in."""
    roll = rng.random()
    if roll < 0.15:
        return "sidecar-bytes", _encode(flip_bytes(text, rng))
    if roll < 0.25:
        spelled = rng.choice(["NaN", "Infinity", "-Infinity", "1e400", "9" * 5000])
        return "sidecar-number", _encode(re.sub(r"(?<=: )\d+", spelled, text, count=1))
    document = json.loads(text)
    paths: list[list] = []
    stack: list[tuple[list, object]] = [([], document)]
    while stack:
        path, value = stack.pop()
        if path:
            paths.append(path)
        if isinstance(value, dict):
            stack.extend((path + [key], item) for key, item in value.items())
        elif isinstance(value, list) and len(value) < 8:
            stack.extend((path + [i], item) for i, item in enumerate(value))
    path = rng.choice(paths)
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    if roll < 0.35:
        del parent[path[-1]]
        return "sidecar-delete", _encode(json.dumps(document))
    if roll < 0.4:
        depth = rng.choice([70, 2000])
        return "sidecar-deep", _encode(json.dumps(document).replace(
            json.dumps(parent[path[-1]]), "[" * depth + "]" * depth, 1))
    parent[path[-1]] = rng.choice(SIDECAR_VALUES)
    return f"sidecar-{path[0]}", _encode(json.dumps(document))


NESTED_READERS = ("hw", "sidecar", "model", "pipeline", "pipeline-analysis")


def nested_document(reader: str, depth: int) -> bytes:
    nest = "[" * depth + "]" * depth
    if reader == "sidecar":
        return _encode('{"inputs": ' + nest + "}")
    prefix = 'kind = "chip"\n' if reader == "hw" else ""
    return _encode(f"{prefix}x = {nest}\n")


NUMBER_VALUES = ["nan", "NaN", "inf", "-inf", "1e400", "-1", "0", "\u0663", "\u0661\u0660",
                 "9" * 5000, "1_000", "0x10", "", " ", "99999999999999999999", "1.5"]


def random_number_options(rng: random.Random) -> tuple[str, list[str]]:
    """Options of number type with values a user (or a script) could pass: analyze-hlo's may
    be valid (the tiny dump analyzes in a second); trace-stage's and plan-search's are always
    bad (a valid one would start a trace)."""
    value = rng.choice(NUMBER_VALUES)
    command = rng.choice(["analyze-hlo", "trace-stage", "plan-search"])
    if command != "analyze-hlo" and value == "1.5":  # a valid --memory-limit: a whole search
        value = "-1.5"
    if command == "analyze-hlo":
        option = rng.choice(["--steps", "--pairs", "--exp-ops", "--caption-tokens",
                             "--dram-efficiency", "--link-bandwidth", "--hop-latency", "--branch",
                             "--timeline-pair"])
        extra = ["--hw", "tx8"] if option not in ("--link-bandwidth", "--branch") else []
        if option == "--hop-latency":
            extra = ["--link-bandwidth", "100"]
        if option == "--timeline-pair":
            extra += ["--timeline", "TIMELINE"]
        return command, [option, value, *extra, "--format", "json"]
    if command == "trace-stage":
        option = rng.choice(["--stage", "--devices", "--batch", "--patches", "--ring-degree",
                             "--zero", "--shape", "--mesh", "--stage-ids"])
        if option in ("--shape", "--mesh", "--stage-ids"):
            value = {"--shape": f"28_64_{value}", "--mesh": f"2x{value}",
                     "--stage-ids": f"0-{value}"}[option]
        return command, ["--config", "tiny", "--mesh", "2x2", option, value]
    option = rng.choice(["--memory-limit", "--budget", "--jobs", "--stages", "--patches",
                         "--devices", "--steps"])
    return command, ["--config", "tiny", option, value]


INTERRUPT_COMMANDS = {
    "analyze-hlo": ("hlo_analyzer.cli", str(HW_DUMP / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"),
                    "--hw", "tx8"),
    "analyze-pipeline": ("hlo_analyzer.pipeline_cli", str(PIPELINE_TOML), *map(str, PIPELINE_STAGES)),
    "trace-stage": ("tracing.cli", "--config", "tiny", "--mesh", "2x2", "--stage-ids", "0-0,1-1",
                    "--stage", "1", "-o", "OUT", "--force"),
    "trace-vae-decode": ("tracing.vae_decode", "--part", "spatial", "--shape", "17_64_64",
                         "--config", "tiny", "-o", "OUT", "--force"),
    "plan-search": ("planning.plan_search_cli", "--config", "tiny", "--devices", "4", "--strategies",
                    "megatron", "--stages", "1", "--budget", "1", "--jobs", "2"),
    "trace-module": ("tracing.module_cli", "models.zoo.gpt2:gpt2", "--input", "ids=4x16:int64",
                     "--strategy", "megatron", "--mesh", "2x2", "-o", "OUT", "--force"),
    "hlo-report": ("hlo_report.cli", "plan", str(REPO_ROOT / "results" / "plan_search" /
                                                 "204_640_360_8xh100.json"), "-o", "PAGE", "--force"),
}
#: The commands that trace (a terminate case stops one of them).
TRACE_COMMANDS = ("trace-module", "trace-stage", "trace-vae-decode")

#: Scheduler addresses: SILENT and HTTP are replaced by the fuzzer's own listeners (one that
#: never answers, one that answers as an HTTP server).
SCHEDULER_ADDRESSES = ["ucx://127.0.0.1:8786", "tls://127.0.0.1:8786", "nonsense", "tcp://:",
                       "tcp://127.0.0.1:99999", "tcp://127.0.0.1:1", "inproc://x", "tcp://h" * 300,
                       "SILENT", "HTTP", "HTTP"]


# --------------------------------------------------------------------------------------------
# hlo-report, trace-module, plan-search (issue 45)
# --------------------------------------------------------------------------------------------

#: hlo-report's JSON pages and the seed each is fuzzed from.
REPORT_PAGES = ("analysis", "pipeline", "plan", "timeline")
PLAN_SEED = REPO_ROOT / "results" / "plan_search" / "204_640_360_8xh100.json"
#: The study's tables copied into a case's results directory (with run.json); one is mutated.
STUDY_TABLES = ("latency", "communication", "flops", "pipelines", "runs", "split", "training")
MARKUP = ("<b>fuzz</b>", '<a href="https://example.invalid">fuzz</a>')
REPORT_VALUES = [int("9" * 401), 1.79e308, -1.79e308, -1, 0, 1e-320, 2**70, "x", "", ["x"], [],
                 {}, None, True, "\ud800", [[1, 2], ["x"]], [-1, 4], *MARKUP]
_report_seeds: dict[str, str] = {}


def report_seed(page: str) -> str:
    """The JSON a page is made from: analyze-hlo's (``--hw tx8``) and its timeline, and
    analyze-pipeline's, of the bundled tiny dumps, each made once by the command (a fresh
    process: this one forks and keeps no MLIR threads); the committed plan-search JSON."""
    if page == "plan":
        return PLAN_SEED.read_text()
    if not _report_seeds:
        import subprocess

        with tempfile.TemporaryDirectory(prefix="fuzz-seeds-") as directory:
            analysis, trace = Path(directory) / "a.json", Path(directory) / "t.json"
            environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
            subprocess.run([sys.executable, "-m", "hlo_analyzer.cli", str(_hardware_dump()), "--hw",
                            "tx8", "--format", "json", "-o", str(analysis), "--timeline", str(trace)],
                           check=True, capture_output=True, env=environment)
            pipeline = subprocess.run([sys.executable, "-m", "hlo_analyzer.pipeline_cli",
                                       str(PIPELINE_TOML), *map(str, PIPELINE_STAGES), "--format",
                                       "json"], check=True, capture_output=True, text=True,
                                      env=environment).stdout
            _report_seeds.update(analysis=analysis.read_text(), timeline=trace.read_text(),
                                 pipeline=pipeline)
    return _report_seeds[page]


def json_values(document, first: int | None = None) -> Iterator[tuple[list, object]]:
    """(path, value) of every value of a JSON document, the document first (of each list its
    ``first`` items, or all), walked with a stack."""
    stack: list[tuple[list, object]] = [([], document)]
    while stack:
        path, value = stack.pop()
        yield path, value
        if isinstance(value, dict):
            stack.extend((path + [key], item) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((path + [i], item) for i, item in enumerate(value[:first]))


def mutate_report(text: str, rng: random.Random) -> tuple[str, bytes]:
    """A page's JSON with one value at any depth replaced (numbers too big to compute with, a
    lone surrogate, a list for a string, markup in a name) or removed; or its bytes flipped."""
    if rng.random() < 0.1:
        return "report-bytes", _encode(flip_bytes(text, rng))
    document = json.loads(text)
    path, _ = rng.choice([(path, value) for path, value in json_values(document, 4) if path])
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    if rng.random() < 0.15:
        del parent[path[-1]]
        return "report-delete", _encode(json.dumps(document))
    parent[path[-1]] = rng.choice(REPORT_VALUES)
    return f"report-{path[0]}", _encode(json.dumps(document))


def mutate_csv(text: str, rng: random.Random) -> tuple[str, bytes]:
    """A study table with one cell replaced (5,000 digits, 1.8e308, markup, a delimiter), a row
    cut short, or its bytes flipped."""
    lines = text.splitlines()
    if rng.random() < 0.1 or len(lines) < 2:
        return "csv-bytes", _encode(flip_bytes(text, rng))
    row = rng.randrange(1, len(lines))
    cells = lines[row].split(",")
    if rng.random() < 0.1:
        lines[row] = ",".join(cells[:-1])
        return "csv-short-row", _encode("\n".join(lines) + "\n")
    cells[rng.randrange(len(cells))] = rng.choice(
        ["9" * 5000, "9" * 401, "1.8e308", "-1.8e308", "1e-400", "nan", "-1", "0", "", "n/a",
         "x", '"a,b"', '"', *MARKUP, "\u00e9", "1_000"])
    lines[row] = ",".join(cells)
    return "csv-cell", _encode("\n".join(lines) + "\n")


#: plan-search options around a training search of the tiny model (seconds: estimated, not
#: traced) and its sizing; OUTPUT is the case's directory.
PLAN_OPTION_VALUES = {
    "--plot": ["OUTPUT/front.png"], "-o": ["OUTPUT/best.toml"], "--json": ["OUTPUT/search.json"],
    "--batch": ["0", "-1", "3", "4", "8", "9" * 40], "--micro-batches": ["", "0", "1,2", "x", "9" * 30],
    "--zero": ["4", "0,1", "-1", "", "0,0"], "--stages": ["0", "1,2", "3", "1"],
    "--memory-limit": ["0", "1e-9", "nan", "1e400", "80"], "--devices": ["0", "3", "4", "9999"],
    "--target-step-time": ["0", "1e-9", "nan", "1"], "--max-devices": ["0", "4", "9" * 30],
}


def plan_search_options(rng: random.Random) -> list[str]:
    options = ["--config", "tiny", "--mode", "train", "--estimate", "ideal", "--no-confirm",
               "--devices", "4"]
    for name in rng.sample(sorted(PLAN_OPTION_VALUES), rng.randint(1, 3)):
        options += [name, rng.choice(PLAN_OPTION_VALUES[name])]
    return options


#: The module trace-module's fuzz cases import (``fuzz_models``): forwards and factories that
#: misbehave, and two that trace.
FUZZ_MODELS = """
import torch

class Tiny(torch.nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
    def forward(self, x):
        return {"y": self.fc(x), "none": None}

class ReturnsNone(torch.nn.Module):
    def forward(self, x):
        return None

class ReturnsInt(torch.nn.Module):
    def forward(self, x):
        return 3

class ReturnsInput(torch.nn.Module):
    def forward(self, x):
        return (x, x)

class ReadsItem(torch.nn.Module):
    def forward(self, x):
        return x * x.sum().item()

class Prints(torch.nn.Module):
    def forward(self, x):
        print(x)
        return x + 1

class Branches(torch.nn.Module):
    def forward(self, x):
        return x + 1 if x.sum() > 0 else x - 1

class Exits(torch.nn.Module):
    def forward(self, x):
        raise SystemExit(3)

class RaisesBase(torch.nn.Module):
    def forward(self, x):
        raise BaseException("from the forward")

class RaisesInterrupt(torch.nn.Module):
    def forward(self, x):
        raise KeyboardInterrupt

class Recurses(torch.nn.Module):
    def forward(self, x):
        return self.forward(x)

def factory_exits():
    raise SystemExit("from the factory")

def factory_raises_base():
    raise BaseException("from the factory")

def not_a_module():
    return 42

class Module(torch.nn.Module):
    pass
"""
MODULE_FACTORIES = ["fuzz_models:Tiny", "fuzz_models:ReturnsNone", "fuzz_models:ReturnsInt",
                    "fuzz_models:ReturnsInput", "fuzz_models:ReadsItem", "fuzz_models:Prints",
                    "fuzz_models:Branches", "fuzz_models:Exits", "fuzz_models:RaisesBase",
                    "fuzz_models:RaisesInterrupt", "fuzz_models:Recurses",
                    "fuzz_models:factory_exits", "fuzz_models:factory_raises_base",
                    "fuzz_models:not_a_module", "fuzz_models:Module", "fuzz_models:nothing",
                    "torch.nn:Identity", "torch.nn:ReLU", "models.zoo.gpt2:gpt2", "no_module:x",
                    "fuzz_models", ":x", "os:getcwd"]
MODULE_OPTIONS = {
    "--input": ["x=4x8:float32", "x=4x8:float32", "input=4x8:float32", "ids=4x16:int64",
                f"x={'9' * 5000}:float32", "x=0x8:float32", "x=scalar:float32", "x=4x8:complex64",
                "x=4x8:int8", "x=3x8:float32", "=4x8:float32", "x=4x8"],
    "--mesh": ["1x2", "2x2", "1x1", "3", "0x2", "1x9999", "2x2x2", "x"],
    "--strategy": ["dp", "megatron", "sp", "none", "nonsense"],
    "--mode": ["infer", "train"], "--dtype": ["float32", "bfloat16", "float16", "int8"],
    "--name": ["../x", "", "a" * 300, ".hidden", "ok"], "--dialect": ["mhlo", "stablehlo"],
}


def trace_module_case(rng: random.Random) -> tuple[str, tuple[str, ...], bytes]:
    """(mutator, argv, the fuzz_models source) of a trace-module run in a fresh process."""
    factory = rng.choice(MODULE_FACTORIES)
    argv = ["tracing.module_cli", factory, "--input",
            "ids=4x16:int64" if factory.startswith("models.zoo") else rng.choice(MODULE_OPTIONS["--input"])]
    if rng.random() < 0.2:
        argv += ["--input", rng.choice(MODULE_OPTIONS["--input"])]
    options = {"--strategy": "dp", "--mesh": "1x2"}
    for name in rng.sample(sorted(MODULE_OPTIONS), rng.randint(0, 2)):
        options[name] = rng.choice(MODULE_OPTIONS[name])
    for name, value in options.items():
        argv += [name, value]
    return f"module-{factory.split(':')[-1] or 'none'}", (*argv, "-o", "OUT", "--force"), \
        _encode(FUZZ_MODELS)


def figure_markup(page: str) -> bool:
    """Whether a page's plotly figures hold markup that came from a name (``<b>``, ``<a``)."""
    for spec in re.findall(r'<script type="application/json" class="figure-spec"[^>]*>(.*?)</script>',
                           page, re.S):
        for _, value in json_values(json.loads(spec)):
            if isinstance(value, str) and ("<b>" in value or "<a " in value):
                return True
    return False


def _mutate(mutator: Callable[[str, random.Random], str], text: str,
            rng: random.Random) -> str:
    """A mutator applied where it has something to work on (an empty or one-line text stays)."""
    if len(text.splitlines()) < 2:
        return text
    return mutator(text, rng)


def _encode(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


# --------------------------------------------------------------------------------------------
# Running a case in a forked, memory-capped child
# --------------------------------------------------------------------------------------------


def _child_main(case: Case, workdir: Path) -> int:
    """What the forked child runs; returns its exit code."""
    from hlo_analyzer.cli import analyze_command
    from hlo_trace.cli import run_click

    if case.kind == "dump":
        dump = workdir / ("module_0001.SyncTensorsGraph.after_spmd-partitioning.txt"
                          if case.seed_name.endswith(".txt") else f"module_{case.index}.mlir")
        dump.write_bytes(case.content)
        return run_click(analyze_command, [str(dump), *case.options])
    if case.kind == "bytecode":
        dump = workdir / f"module_{case.index}.mlirbc"
        dump.write_bytes(case.content)
        return run_click(analyze_command, [str(dump), *case.options])
    if case.kind == "sidecar":
        sidecar = workdir / "sidecar.json"
        sidecar.write_bytes(case.content)
        return run_click(analyze_command, [str(_hardware_dump()), "--sidecar", str(sidecar),
                                           "--hw", "tx8", "--format", "json"])
    if case.kind == "stage-sidecar" or (case.kind == "nested" and case.options[0] != "hw"):
        return _run_pipeline_case(case, workdir)
    if case.kind == "nested":
        toml = workdir / "hw.toml"
        toml.write_bytes(case.content)
        return run_click(analyze_command, [str(_hardware_dump()), "--hw", str(toml)])
    if case.kind == "option":
        return _run_option_case(case, workdir)
    if case.kind in ("report", "report-csv"):
        return _run_report_case(case, workdir)
    if case.kind == "plan":
        from planning.plan_search_cli import plan_search_command

        return run_click(plan_search_command, [*_in_workdir(case.options, workdir), "--work-dir",
                                               str(workdir / "work")])
    if case.kind == "hardware":
        toml = workdir / "hw.toml"
        toml.write_bytes(case.content)
        dump = _hardware_dump()
        return run_click(analyze_command, [str(dump), "--hw", str(toml), "--format", "json"])
    toml = workdir / f"{case.kind}.toml"
    toml.write_bytes(case.content)
    return _load_trace_toml(case.kind, toml)


def _load_trace_toml(kind: str, toml: Path) -> int:
    """A model (``kind`` "model") or pipeline TOML through trace-stage's loader: 0 when it
    loads, 2 and one ``Error:`` line when it is refused."""
    from hlo_trace.errors import UsageError

    try:
        if kind == "model":
            from models.opensora.config import get_config

            get_config(toml)
        else:
            from plans.config import load_config_file

            load_config_file(toml)
    except UsageError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 2
    return 0


def _run_pipeline_case(case: Case, workdir: Path) -> int:
    """A stage sidecar mutated (analyze-pipeline), or a nested document given to its reader."""
    import shutil

    from hlo_analyzer.cli import analyze_command
    from hlo_analyzer.pipeline_cli import pipeline_command
    from hlo_trace.cli import run_click

    stages = []
    for stage in PIPELINE_STAGES:
        for suffix in (".mlir", ".json"):
            shutil.copy(stage.with_suffix(suffix), workdir / stage.with_suffix(suffix).name)
        stages.append(workdir / stage.name)
    plan = PIPELINE_TOML
    if case.kind == "stage-sidecar":
        stages[int(case.seed_name.removeprefix("stage"))].with_suffix(".json").write_bytes(case.content)
        return run_click(pipeline_command, [str(plan), *map(str, stages), "--format", "json"])
    reader = case.options[0]
    document = workdir / ("doc.json" if reader == "sidecar" else "doc.toml")
    document.write_bytes(case.content)
    if reader == "sidecar":
        return run_click(analyze_command, [str(_hardware_dump()), "--sidecar", str(document)])
    if reader == "pipeline-analysis":
        return run_click(pipeline_command, [str(document), *map(str, stages)])
    return _load_trace_toml(reader, document)


def _run_option_case(case: Case, workdir: Path) -> int:
    """Number options of analyze-hlo (on the tiny dump), trace-stage or plan-search."""
    from hlo_analyzer.cli import analyze_command
    from hlo_trace.cli import run_click

    options = [str(workdir / "timeline.json") if o == "TIMELINE" else o for o in case.options]
    if case.seed_name == "analyze-hlo":
        return run_click(analyze_command, [str(_hardware_dump()), *options])
    if case.seed_name == "trace-stage":
        from tracing.cli import main as trace_main

        return run_click(trace_main, [*options, "-o", str(workdir / "out")])
    from planning.plan_search_cli import plan_search_command

    return run_click(plan_search_command, [*options, "--work-dir", str(workdir / "work"),
                                           "-o", str(workdir / "best.toml")])


def _run_report_case(case: Case, workdir: Path) -> int:
    """hlo-report on a mutated page JSON, or ``study`` on the study's tables with one mutated."""
    import shutil

    from hlo_report.cli import report_command
    from hlo_trace.cli import run_click

    page = str(workdir / "page.html")
    if case.kind == "report-csv":
        study = workdir / "results"
        study.mkdir()
        shutil.copy(REPO_ROOT / "results" / "run.json", study / "run.json")
        for table in STUDY_TABLES:
            shutil.copy(REPO_ROOT / "results" / f"{table}.csv", study / f"{table}.csv")
        (study / f"{case.seed_name}.csv").write_bytes(case.content)
        return run_click(report_command, ["study", str(study), "-o", page])
    document = workdir / "report.json"
    document.write_bytes(case.content)
    if case.seed_name == "timeline":
        analysis = workdir / "analysis.json"
        analysis.write_text(report_seed("analysis"))
        return run_click(report_command, ["analysis", str(analysis), "--timeline", str(document),
                                          "-o", page])
    return run_click(report_command, [case.seed_name, str(document), "-o", page])


def _in_workdir(arguments: tuple[str, ...], workdir: Path) -> list[str]:
    """The case's arguments with its placeholders made paths in its directory: OUT (a dump
    directory), PAGE (a report page), OUTPUT/name (a file)."""
    named = {"OUT": str(workdir / "out"), "PAGE": str(workdir / "page.html")}
    return [named.get(arg, arg.replace("OUTPUT/", f"{workdir}/")) for arg in arguments]


def _requested_outputs(case: Case, workdir: Path) -> list[Path]:
    """The files a plan-search case asked for (--plot, -o, --json): written when it exits 0."""
    options = _in_workdir(case.options, workdir)
    return [Path(value) for name, value in zip(options, options[1:])
            if name in ("--plot", "-o", "--json") and value.startswith(str(workdir))]


def _hardware_dump() -> Path:
    """A tiny dump whose 2x2 mesh fits every bundled system (tx8-16 has 16 chips)."""
    return HW_DUMP / "tiny_28_64_64_megatron_2x2_stage1_pairs1-1.mlir"


def _run_child(case: Case, workdir: Path, memory_bytes: int) -> int:
    """Fork; in the child: cap memory, send stdout/stderr to files, run the case, exit."""
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        os.setpgid(0, 0)  # its own group: a hang is killed with all its children
        if case.argv:  # torch and XLA map ~5 GB of address space: peak RSS is what is bounded
            memory_bytes = max(memory_bytes, EXEC_ADDRESS_SPACE_BYTES)
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        os.environ["TMPDIR"] = tempfile.tempdir = str(workdir / "tmp")  # its own: leaks are its
        for fd, name in ((1, "stdout"), (2, "stderr")):
            handle = os.open(workdir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(handle, fd)
            os.close(handle)
        if case.argv:  # a command in a fresh process, as a user starts it
            os.chdir(workdir)
            argv = _in_workdir(case.argv, workdir)
            if argv[0] == "planning.plan_search_cli":
                argv += ["--work-dir", str(workdir / "work"), "-o", str(workdir / "best.toml")]
            if case.kind == "module":  # its own models, importable as fuzz_models
                (workdir / "fuzz_models.py").write_bytes(case.content)
            environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(workdir)])}
            environment.pop("HLO_TRACE_PARENT_PID", None)
            os.execve(sys.executable, [sys.executable, "-m", *argv], environment)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the child's own streams
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        code = _child_main(case, workdir)
        sys.stdout.flush()
        sys.stderr.flush()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # an escape from run_click itself: count it as internal
        code = 1
    os._exit(code)


def classify(case: Case, status: int | None, seconds: float, workdir: Path) -> Outcome:
    stderr = (workdir / "stderr").read_text(errors="replace") if (workdir / "stderr").exists() else ""
    tail = "\n".join(stderr.strip().splitlines()[-3:])
    if status is None:
        return Outcome(case, "hang", None, seconds, tail)
    if case.kind == "interrupt" and _before_the_command(status, stderr):
        # interrupted while the interpreter itself started (site.py, an editable install's
        # hook, runpy finding the module), before any code of the command ran: Python's own
        # report, counted apart
        return Outcome(case, "interpreter-start", None, seconds, tail)
    if case.kind == "terminate" and (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
                                     or os.waitstatus_to_exitcode(status) == 128 + signal.SIGTERM):
        return Outcome(case, "terminated", None, seconds, tail)
    if os.WIFSIGNALED(status):
        return Outcome(case, "signal", -os.WTERMSIG(status), seconds, tail)
    code = os.WEXITSTATUS(status)
    if code == 0:
        return Outcome(case, _finished_class(case, workdir), 0, seconds, tail)
    if case.kind in ("interrupt", "scheduler", "option", "module", "plan", "terminate") \
            and code in (2, 130):
        # progress lines ("[stage 1] trace: ...") may come first: the last line is the verdict
        lines = [line for line in stderr.splitlines() if line.strip()
                 and not line.startswith(("[stage", "estimating", "["))
                 and not re.match(r"^(W|I)\d{4} |^\d{4}-\d\d-\d\d ", line)]
        verdict = lines[-1:] if lines else []
        clean = "Traceback" not in stderr and "Exception ignored" not in stderr
        if code == 130:
            good = clean and verdict == ["Interrupted."] and case.kind == "interrupt"
            return Outcome(case, "interrupted" if good else "messy", 130, seconds, tail)
        good = clean and len(lines) == 1 and lines[0].startswith("Error: ")
        return Outcome(case, "usage" if good else "messy", 2, seconds, tail)
    if code == 2:
        lines = [line for line in stderr.splitlines() if line.strip()]
        one_line = len(lines) == 1 and lines[0].startswith("Error: ")
        return Outcome(case, "usage" if one_line else "messy", 2, seconds, tail)
    if code == NO_ANSWER and case.command == "plan-search" and "Error:" not in stderr:
        return Outcome(case, "no-answer", NO_ANSWER, seconds, tail)
    if code == 1:
        return Outcome(case, "internal", 1, seconds, tail)
    return Outcome(case, "other", code, seconds, tail)


def _before_the_command(status: int, stderr: str) -> bool:
    """Whether an interrupt ended the interpreter before any file of the project ran: its
    ``site`` start-up failed, or it died of SIGINT with no output at all (before Python installs
    its handler) or with a traceback of the standard library's frames alone (runpy)."""
    if "init_import_site" in stderr:
        return True
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT):
        return False
    lines = stderr.strip().splitlines()
    return not lines or (lines[0].startswith("Traceback") and lines[-1] == "KeyboardInterrupt"
                         and str(REPO_ROOT) not in stderr)


def _finished_class(case: Case, workdir: Path) -> str:
    """The class of a case that exited 0: its JSON report's numbers sane, a page's figures free
    of markup from names, a plan search's requested files written."""
    stdout = workdir / "stdout"
    if not _numbers_sane(stdout.read_text(errors="replace") if stdout.exists() else ""):
        return "bad-numbers"
    page = workdir / "page.html"
    if case.kind in ("report", "report-csv") and page.exists() and figure_markup(page.read_text()):
        return "markup"
    if case.kind == "plan" and not all(path.exists() for path in _requested_outputs(case, workdir)):
        return "unwritten"
    return "ok"


def leaked_temp(workdir: Path, within_s: float) -> list[str]:
    """The XLA dump folders (LEAK_GLOB) still in the case's temporary directory ``within_s``
    after it ended."""
    deadline = time.monotonic() + within_s
    while True:
        left = sorted(path.name for path in (workdir / "tmp").glob(LEAK_GLOB))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _numbers_sane(text: str) -> bool:
    """No negative, NaN or infinite number anywhere in a JSON report (non-JSON output: True)."""
    if not text.lstrip().startswith("{"):
        return True
    try:
        document = json.loads(text)
    except ValueError:
        return False
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0 or (isinstance(value, float) and not math.isfinite(value)):
                return False
    return True


def run_cases(cases: list[Case], *, jobs: int = 2, timeout_s: float = 30.0,
              memory_bytes: int = 4000 * 2**20,
              report: Callable[[Outcome], None] | None = None) -> Tally:
    """Run every case in a forked child, ``jobs`` at a time, each within ``timeout_s``."""
    import hlo_analyzer.cli  # noqa: F401 - imported once here, inherited by every fork
    import hlo_analyzer.mlir  # noqa: F401
    import plans.config  # noqa: F401

    tally = Tally()
    pending = list(cases)
    running: dict[int, tuple[Case, Path, float]] = {}
    signalled: set[int] = set()
    silent, http = listener(None), listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    addresses = {"SILENT": f"tcp://127.0.0.1:{silent.getsockname()[1]}",
                 "HTTP": f"tcp://127.0.0.1:{http.getsockname()[1]}"}
    with tempfile.TemporaryDirectory(prefix="fuzz-") as root:
        while pending or running:
            while pending and len(running) < jobs:
                case = pending.pop(0)
                if case.kind == "scheduler" and case.seed_name in addresses:
                    argv = tuple(addresses.get(arg, arg) for arg in case.argv)
                    case = Case(case.index, case.kind, case.mutator, case.seed_name, case.content,
                                case.options, argv, case.interrupt_after)
                workdir = Path(root) / str(case.index)
                (workdir / "tmp").mkdir(parents=True)
                running[_run_child(case, workdir, memory_bytes)] = (case, workdir, time.monotonic())
            for pid, (case, workdir, started) in list(running.items()):
                done, status, usage = os.wait4(pid, os.WNOHANG)
                elapsed = time.monotonic() - started
                if (not done and case.interrupt_after is not None and pid not in signalled
                        and elapsed >= case.interrupt_after):
                    os.kill(pid, signal.SIGTERM if case.kind == "terminate" else signal.SIGINT)  # the command alone
                    signalled.add(pid)
                if not done and elapsed < timeout_s:
                    continue
                hung = ""
                if not done:  # a hang: note what still runs, kill the child and all it forked
                    hung = running_processes(pid)
                    _kill_group(pid)
                    status, usage = None, None
                outcome = classify(case, status, elapsed, workdir)
                outcome.stderr_tail += hung
                outcome.peak_rss_bytes = usage.ru_maxrss * 1024 if usage is not None else 0
                if status is not None and _orphans(pid, within_s=1.0):
                    _kill_group(pid)
                    outcome.klass = "orphan"
                elif status is not None and leaked_temp(workdir, within_s=1.0):
                    outcome.klass = "leaked-temp"
                del running[pid]
                signalled.discard(pid)
                tally.add(outcome)
                shutil.rmtree(workdir, ignore_errors=True)  # pages are ~5 MB: keep the disk
                if report:
                    report(outcome)
            time.sleep(0.005)
    silent.close()
    http.close()
    return tally


def listener(reply: bytes | None):
    """A TCP listener on localhost that accepts and then sends ``reply`` (None: never answers),
    in a daemon thread: a --scheduler that is no Dask scheduler."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            held.append(connection)
            if reply is not None:
                try:
                    connection.sendall(reply)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return server


def group_members(group: int) -> list[int]:
    """Live (not zombie) processes of process group ``group``, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def running_processes(group: int) -> str:
    """The processes of a hung case's group, each as its state and command line (for the
    report's examples)."""
    described = []
    for pid in group_members(group):
        try:
            state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        described.append(f"{pid} {state} {command.decode(errors='replace')[:120]}")
    return "\nstill running: " + "; ".join(described) if described else ""


def _orphans(group: int, within_s: float) -> bool:
    """Whether a process of the finished case's group is still running ``within_s`` after it."""
    deadline = time.monotonic() + within_s
    while group_members(group):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


def _kill_group(pid: int) -> None:
    for target in (-pid, pid):
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


#: Cases between two progress lines on stderr.
PROGRESS_EVERY = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--memory-mb", type=int, default=4000, help="address-space cap per case")
    parser.add_argument("--examples", type=int, default=3, help="examples shown per failing class")
    parser.add_argument("--keep", type=Path, default=None,
                        help="directory to save the inputs of failing cases into")
    parser.add_argument("--log", type=Path, default=None,
                        help="also write the summary (command, seed, date, counts) to this file")
    parser.add_argument("--quick", action="store_true",
                        help="12 cases (seconds; CI checks that the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.cases = 12

    started_at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    started = time.perf_counter()
    cases = list(make_cases(args.cases, args.seed))
    done: list[Outcome] = []

    def progress(outcome: Outcome) -> None:
        done.append(outcome)
        if len(done) % PROGRESS_EVERY == 0:
            failing = sum(o.klass not in GOOD_CLASSES for o in done)
            print(f"[{len(done)}/{len(cases)}] {time.perf_counter() - started:.0f} s, "
                  f"{failing} failing", file=sys.stderr, flush=True)

    tally = run_cases(cases, jobs=args.jobs, timeout_s=args.timeout,
                      memory_bytes=args.memory_mb * 2**20, report=progress)
    elapsed = time.perf_counter() - started
    lines = summary(args, cases, tally, elapsed, started_at)
    print("\n".join(lines))
    if args.log:
        from hlo_trace.atomic import atomic_write

        args.log.parent.mkdir(parents=True, exist_ok=True)
        # the log is committed: paths of this checkout are written relative to it
        atomic_write(args.log, "\n".join(lines).replace(f"{REPO_ROOT}/", "") + "\n", force=True)
        counts = {"cases": len(cases), "seed": args.seed, "started": started_at, "seconds": round(elapsed),
                  "classes": {klass: tally.by_class.get(klass, 0) for klass in CLASSES},
                  "failing": sum(n for klass, n in tally.by_class.items() if klass not in GOOD_CLASSES),
                  "over_memory": tally.over_memory, "slowest_s": round(tally.slowest_s, 1),
                  "commands": {name: dict(tally.by_command.get(name, Counter())) for name in COMMAND_NAMES}}
        atomic_write(args.log.with_suffix(".json"), json.dumps(counts, indent=1) + "\n", force=True)
        print(f"wrote {args.log} and {args.log.with_suffix('.json')} (the counts the docs quote)")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        for klass, outcomes in sorted(tally.examples.items()):
            for outcome in outcomes[:args.examples]:
                case = outcome.case
                (args.keep / f"{klass}-{case.index}-{case.seed_name}").write_bytes(case.content)
    sys.exit(1 if tally.failures else 0)


def summary(args: argparse.Namespace, cases: list[Case], tally: Tally, elapsed: float,
            started_at: str) -> list[str]:
    """The run's report: how it was run, the count per class, per command and per mutator, and
    the first examples of every failing class."""
    import platform
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, text=True,
                            capture_output=True).stdout.strip() or "unknown"
    lines = [f"command: python3 benchmarks/fuzz.py {' '.join(sys.argv[1:])}",
             f"seed {args.seed}; started {started_at}; commit {commit}; "
             f"{platform.machine()} with {os.cpu_count()} CPUs; Python {platform.python_version()}",
             f"{len(cases)} cases in {elapsed:.0f} s ({len(cases) / max(elapsed, 1e-9) * 60:.1f} cases "
             f"per minute), {args.jobs} at a time, {args.timeout:.0f} s and {args.memory_mb} MB each",
             "outcome classes:"]
    lines += [f"  {klass:17s} {tally.by_class.get(klass, 0):6d}" for klass in CLASSES]
    lines.append(f"runs over {MEMORY_BOUND_BYTES >> 30} GiB of peak RSS: {tally.over_memory}; "
                 f"slowest case {tally.slowest_s:.1f} s")
    kinds = Counter(case.kind for case in cases)
    lines.append("inputs (cases, mean seconds): " + ", ".join(
        f"{kind} {count} ({tally.seconds_by_kind[kind] / count:.1f} s)"
        for kind, count in sorted(kinds.items())))
    lines.append(f"by command ({'/'.join(GOOD_CLASSES[:2])}/other good/failing):")
    for name in COMMAND_NAMES:
        counter = tally.by_command.get(name, Counter())
        bad = sum(v for k, v in counter.items() if k not in GOOD_CLASSES)
        good = sum(counter.values()) - bad - counter.get("ok", 0) - counter.get("usage", 0)
        lines.append(f"  {name:17s} {counter.get('ok', 0):5d} {counter.get('usage', 0):5d} "
                     f"{good:5d} {bad:5d}")
    lines.append("by mutator (ok/usage or interrupted or terminated/failing):")
    for name, counter in sorted(tally.by_mutator.items()):
        bad = sum(v for k, v in counter.items() if k not in GOOD_CLASSES)
        stopped = counter.get("usage", 0) + counter.get("interrupted", 0) + counter.get("terminated", 0)
        lines.append(f"  {name:32s} {counter.get('ok', 0):5d} {stopped:5d} {bad:5d}")
    for klass, outcomes in sorted(tally.examples.items()):
        lines.append(f"examples of {klass}:")
        for outcome in outcomes[:args.examples]:
            case = outcome.case
            lines.append(f"  #{case.index} {case.kind} {case.seed_name} {case.mutator} "
                         f"{' '.join(case.options or case.argv)[:300]} -> {outcome.exit_code} in "
                         f"{outcome.seconds:.1f} s: {outcome.stderr_tail[-600:]!r}")
    lines.append(f"failures (not {'/'.join(GOOD_CLASSES)}): {tally.failures}")
    return lines


if __name__ == "__main__":
    main()
