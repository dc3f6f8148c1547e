"""Every output of every bundled dump, and every committed result, hashed into one manifest.

The check of a refactoring that must not change a byte: run it before and after and diff the
manifests. It runs, in this process and through the installed console scripts' entry points
(so it follows a command that moves to another module), on every dump under ``dumps/`` and the
package's example dump:

* ``analyze-hlo`` without ``--hw``: the summary table, ``--by op`` as text and CSV,
  ``--by category`` CSV and the JSON report;
* with ``--hw tx8``, ``h100-sxm`` and ``n150``, each execution mode (``fused``, ``eager``,
  ``torch``): the JSON report; in the default mode also the summary text, ``--by block`` text,
  ``--by kernel`` CSV, the timeline and the kernel list;
* ``analyze-pipeline`` on the bundled pipeline example (text, JSON, CSV);
* ``--help`` of every console script (its options must stay the same).

Each command's output file, its stdout, stderr and exit code land in OUT; ``OUT/MANIFEST`` lists
the SHA-256 of each of them and of every file under ``results/``. Takes a few minutes.

    python3 scripts/golden_outputs.py OUT
    diff OUT_BEFORE/MANIFEST OUT_AFTER/MANIFEST
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("tx8", "h100-sxm", "n150")
MODES = ("fused", "eager", "torch")
PLAIN = (("summary.txt", ["--format", "table"]),
         ("op.txt", ["--format", "table", "--by", "op"]),
         ("op.csv", ["--format", "csv", "--by", "op"]),
         ("category.csv", ["--format", "csv", "--by", "category"]),
         ("report.json", ["--format", "json"]))
MAPPED = (("summary.txt", ["--format", "table"]),
          ("block.txt", ["--format", "table", "--by", "block"]),
          ("kernel.csv", ["--format", "csv", "--by", "kernel"]))


def _command(name: str):
    (point,) = [p for p in entry_points(group="console_scripts") if p.name == name]
    return point.load()


def _run(main, argv: list[str], out: Path) -> None:
    """Run one command's ``main`` in this process; write its stdout, stderr and exit code."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code
    text = f"exit {code}\n--- stdout\n{stdout.getvalue()}--- stderr\n{stderr.getvalue()}"
    out.with_suffix(out.suffix + ".log").write_text(text.replace(str(out.parent), "OUT"))


def _dumps() -> list[Path]:
    found = sorted((ROOT / "dumps").rglob("*.mlir"))
    examples = sorted((ROOT / "hlo_trace" / "examples").glob("example_*"))
    return found + [p for p in examples if p.suffix != ".json"]


def _analyze(analyze, dump: Path, out: Path) -> None:
    tag = str(dump.relative_to(ROOT)).replace("/", "__")
    for name, args in PLAIN:
        target = out / f"{tag}.plain.{name}"
        _run(analyze, [str(dump), *args, "-o", str(target)], target)
    for system in SYSTEMS:
        for mode in MODES:
            target = out / f"{tag}.{system}.{mode}.json"
            _run(analyze, [str(dump), "--hw", system, "--exec", mode, "--format", "json",
                           "-o", str(target)], target)
        for name, args in MAPPED:
            target = out / f"{tag}.{system}.default.{name}"
            extra = []
            if name == "summary.txt":
                extra = ["--timeline", str(out / f"{tag}.{system}.timeline.json")]
            _run(analyze, [str(dump), "--hw", system, *args, *extra, "-o", str(target)], target)
        target = out / f"{tag}.{system}.kernels.json"  # an error on a program with collectives
        _run(analyze, [str(dump), "--hw", system, "--kernels", str(target), "-o",
                       str(out / f"{tag}.{system}.kernels.txt")], target)


def _pipeline(out: Path) -> None:
    pipeline = _command("analyze-pipeline")
    folder = ROOT / "dumps" / "pipeline"
    stages = [str(p) for p in sorted(folder.glob("*.mlir"))]
    for fmt in ("table", "json", "csv"):
        target = out / f"pipeline.{fmt}"
        _run(pipeline, [str(folder / "tiny_2x2_stages.toml"), *stages, "--format", fmt,
                        "-o", str(target)], target)


def _helps(out: Path) -> None:
    for point in sorted(entry_points(group="console_scripts"), key=lambda p: p.name):
        if point.value.split(".")[0] in {"hlo_analyzer", "hlo_report", "tracing", "planning"}:
            _run(point.load(), ["--help"], out / f"help.{point.name}")


def _manifest(out: Path) -> None:
    lines = []
    for folder, prefix in ((out, "out"), (ROOT / "results", "results")):
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "MANIFEST"):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            lines.append(f"{digest}  {prefix}/{path.relative_to(folder)}")
    (out / "MANIFEST").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="an empty or new folder for the outputs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if any(args.out.iterdir()):
        sys.exit(f"Error: {args.out} is not empty")
    start = time.perf_counter()
    analyze = _command("analyze-hlo")
    dumps = _dumps()
    for index, dump in enumerate(dumps, 1):
        print(f"[{index}/{len(dumps)}] {dump.relative_to(ROOT)}", file=sys.stderr)
        _analyze(analyze, dump, args.out)
    _pipeline(args.out)
    _helps(args.out)
    _manifest(args.out)
    print(f"{args.out / 'MANIFEST'} in {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
