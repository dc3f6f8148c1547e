"""Getting the per-device program after SPMD partitioning out of torch-xla, without executing it.

torch-xla reads its device count (``CPU_NUM_DEVICES``) and XLA's dump flags (``XLA_FLAGS``) once,
when its runtime starts.  So the order matters and is fixed here:

1. :func:`prepare_process` sets the environment (before ``torch_xla`` is imported or used);
2. the caller builds, shards and runs the model lazily on the XLA device;
3. :func:`capture_partitioned_hlo` compiles the pending graph *without executing it*
   (``_xla_warm_up_cache``) and returns XLA's ``after_spmd-partitioning`` HLO text: the
   per-device program with local shapes and the collectives GSPMD inserted, before any
   backend fusion;
4. :func:`release` removes the temporary dump directory;
5. :func:`end_process` exits at once if a compile is still running (see below).

The dump directory is also removed when the process ends in any other way (an error, SIGTERM,
SIGINT, SIGKILL, a crash): a watcher (:func:`_remove_when_process_ends`) waits for this process
to end and then deletes it, since XLA's background compile may write into it until the end.

Partitioning is the first thing XLA does; the rest of a CPU compile (fusion, LLVM code
generation) is of no use here and takes most of the time: 167 s of the 181 s that a full-size
14-block stage took to trace before (1.3 s now).  So the compile runs in a background thread and
the capture returns as soon as the partitioned module has been written completely.  XLA cannot cancel a compile, so a process that
captured this way ends with :func:`end_process`, which leaves without waiting for it.

A process can capture several graphs (e.g. a stage and then a check): the dump directory is
emptied before each compilation so that exactly one partitioned module is found afterwards.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

#: XLA dumps every pass of every module unless told otherwise; these keep only the one we need.
#: ``SyncTensorsGraph`` is the name torch-xla gives the module it compiles for ``mark_step``-like
#: syncs (and for ``_xla_warm_up_cache``).
#: XLA dumps the module between two passes when either one's name matches the pass filter, so
#: ``spmd-partitioning`` also wrote the module before the partitioner (a second full print on
#: the way to the one we read); the partitioner is the last pass of the ``spmd-partitioner``
#: pipeline, so the boundary before that pipeline's end is the module after it, alone.
_DUMP_PASS_FILTER = "^pipeline-end$"
_DUMP_PIPELINE_FILTER = "^spmd-partitioner$"
_DUMP_MODULE_FILTER = "SyncTensorsGraph"
_PARTITIONED_GLOB = "*after_spmd-partitioning*.txt"
#: On one device XLA skips the SPMD partitioner; its input module is then the per-device program.
_UNPARTITIONED_GLOB = "*SyncTensorsGraph*.before_optimizations.txt"
#: XLA passes kept from running. The SPMD partitioner ends with a clean-up that runs common
#: subexpression elimination (``cse``) over the partitioned module, before the dump is written;
#: on one device there is no partitioner, and the dump is the module as torch-xla built it. So
#: with CSE two identical computations of the traced program (OpenSora's official path calls
#: ``norm1(x)`` twice, for the modulation by t and by t0) were one in every partitioned dump
#: and two in a one-device dump: the partitioned program lost ops that the model computes (and
#: that PyTorch launches on every GPU), and the program of a pair depended on the device count.
#: Without it the partitioned dump is the traced program, partitioned: the one-device program
#: op for op, with local shapes and the collectives. (Collectives carry channel ids, which CSE
#: never merged: the collective counts are the same either way.)
_DISABLED_PASSES = ("cse",)
_DISABLE_PASSES_FLAG = "--xla_disable_hlo_passes"
#: How often the capture looks for the partitioned module while XLA compiles.
_POLL_SECONDS = 0.1


class CaptureError(RuntimeError):
    """The partitioned program could not be obtained (an internal failure, not a user error)."""


@dataclass
class CaptureSession:
    """What :func:`prepare_process` arranged: where XLA dumps, and how many devices exist;
    and the compile left running by the last capture, if any."""

    dump_dir: Path
    num_devices: int
    op_metadata: bool
    background_compile: threading.Thread | None = field(default=None, repr=False)

    @property
    def compiling(self) -> bool:
        return self.background_compile is not None and self.background_compile.is_alive()


#: torch-xla's switch for the torch op type and name on every HLO op (read when torch-xla is
#: imported: a process that imports it before ``prepare_process`` sets this first).
OP_METADATA_ENV = "XLA_HLO_DEBUG"


def prepare_process(num_devices: int, *, op_metadata: bool = True,
                    dump_root: str | os.PathLike | None = None,
                    keep_every_op: bool = True) -> CaptureSession:
    """Set the environment so that torch-xla starts with ``num_devices`` virtual CPU devices,
    SPMD on, and XLA dumping the partitioned module.  Must run before torch-xla's runtime starts.

    ``op_metadata`` sets ``XLA_HLO_DEBUG=1`` so each HLO op carries its torch op type and name;
    they become MLIR locations in the dump (about 1.5x the text size; worth it for reports).
    ``keep_every_op`` keeps XLA's CSE from merging identical computations
    (:data:`_DISABLED_PASSES`). A training step is traced with it off: its memory accounting
    (what the forward keeps for the backward, ``models.opensora.training_theory``) counts the
    merged program, where the backward's re-made broadcasts and casts of forward values are
    those values.
    """
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    if _runtime_started():
        raise CaptureError(
            "torch_xla's runtime has already started in this process; "
            "prepare_process() must run first (trace in a fresh process)")
    dump_dir = Path(tempfile.mkdtemp(prefix="hlo_trace_xla_dump_", dir=dump_root))
    _remove_when_process_ends(dump_dir)
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ["CPU_NUM_DEVICES"] = str(num_devices)
    if op_metadata:
        os.environ[OP_METADATA_ENV] = "1"
    # Keep whatever flags the user set, but our dump flags must win.
    flags = os.environ.get("XLA_FLAGS", "").split()
    disabled = [name for flag in flags if flag.startswith(_DISABLE_PASSES_FLAG + "=")
                for name in flag.partition("=")[2].split(",") if name]
    disabled += list(_DISABLED_PASSES) if keep_every_op else []
    inherited = [flag for flag in flags
                 if not flag.startswith(("--xla_dump_to", "--xla_dump_hlo_as_text",
                                         "--xla_dump_hlo_pass_re", "--xla_dump_hlo_module_re",
                                         "--xla_dump_hlo_pipeline_re",
                                         _DISABLE_PASSES_FLAG))]
    os.environ["XLA_FLAGS"] = " ".join(inherited + [
        f"--xla_dump_to={dump_dir}",
        "--xla_dump_hlo_as_text",
        f"--xla_dump_hlo_pass_re={_DUMP_PASS_FILTER}",
        f"--xla_dump_hlo_pipeline_re={_DUMP_PIPELINE_FILTER}",
        f"--xla_dump_hlo_module_re={_DUMP_MODULE_FILTER}",
    ] + ([f"{_DISABLE_PASSES_FLAG}={','.join(dict.fromkeys(disabled))}"] if disabled else []))
    log.debug("XLA environment: %d CPU devices, dumping to %s", num_devices, dump_dir)
    return CaptureSession(dump_dir=dump_dir, num_devices=num_devices, op_metadata=op_metadata)


#: The watcher of :func:`_remove_when_process_ends`: a shell that ignores the interrupts a
#: terminal sends to the whole group (``trap ''``: inherited by what it runs), reads its standard
#: input until this process and every process that inherited the pipe's other end have ended
#: (end of file), collecting the further directories written there one a line, then deletes
#: them and the dump directory (``$1``).
_WATCHER_SCRIPT = ("trap '' INT TERM HUP QUIT; "
                   'while IFS= read -r extra; do set -- "$@" "$extra"; done; rm -rf -- "$@"')
#: torch's own temporary directory (``torch.distributed.nn.jit.instantiator``, made when torch
#: loads, deleted by an atexit handler that a trace process, ended by ``os._exit``, never runs).
_TORCH_TEMP_MODULE = "torch.distributed.nn.jit.instantiator"
#: This process's end of the watchers' pipes: open until the process ends.
_watched: list[subprocess.Popen] = []


def _remove_when_process_ends(directory: Path) -> None:
    """Start a watcher that deletes ``directory`` once this process has ended, however it ends
    (its ``finally`` blocks and atexit handlers do not run on SIGTERM, SIGKILL or a crash, and
    XLA's background compile writes into the directory until then). No shell: nothing."""
    try:
        _watched.append(subprocess.Popen(  # noqa: S603 - a fixed script, the directory as $0
            ["/bin/sh", "-c", _WATCHER_SCRIPT, "watcher", str(directory)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    except OSError as error:  # no /bin/sh, or no process left: release() still deletes it
        log.debug("no watcher for %s: %s", directory, error)


def _runtime_started() -> bool:
    """True when torch-xla's computation client exists (its env settings are then frozen)."""
    if "torch_xla" not in sys.modules:
        return False
    import torch_xla

    probe = getattr(torch_xla._XLAC, "_xla_runtime_is_initialized", None)
    return bool(probe()) if probe is not None else False


def enable_spmd() -> None:
    """Switch torch-xla to SPMD mode (one virtual device; shardings decide the real layout)."""
    import torch_xla.runtime as xr

    xr.use_spmd()
    _watch_torch_temp()  # torch is loaded by now


def device_count() -> int:
    import torch_xla.runtime as xr

    return xr.global_runtime_device_count()


def capture_partitioned_hlo(session: CaptureSession, outputs: Sequence[torch.Tensor],  # noqa: F821
                            *, finish_compile: bool = False) -> str:
    """Compile the lazy graph that produces ``outputs`` (no execution) and return the
    after-SPMD-partitioning HLO text of that graph.

    Returns as soon as XLA has written the partitioned module, leaving the rest of the compile
    running in the background (end the process with :func:`end_process`); with
    ``finish_compile`` it waits for the whole compile, e.g. to execute the graph afterwards.
    """
    import torch_xla

    if session.compiling:
        raise CaptureError("a previous compile is still running in this process")
    _empty_directory(session.dump_dir)
    failures: list[BaseException] = []

    def compile_graph() -> None:
        try:
            torch_xla._XLAC._xla_warm_up_cache(list(outputs), [])
        except BaseException as error:  # reported by the waiting thread
            failures.append(error)

    worker = threading.Thread(target=compile_graph, name="xla-compile", daemon=True)
    session.background_compile = worker
    worker.start()
    path = _wait_for_partitioned_module(session, worker)
    if failures:
        raise CaptureError(f"XLA failed to compile the graph: {failures[0]}") from failures[0]
    text = path.read_text()
    log.debug("partitioned HLO: %s (%d bytes)", path.name, len(text))
    if finish_compile:
        worker.join()
        _empty_directory(session.dump_dir)
    elif worker.is_alive():
        log.debug("the rest of XLA's compile goes on in the background")
    return text


def _wait_for_partitioned_module(session: CaptureSession, worker: threading.Thread) -> Path:
    """Poll the dump directory until the partitioned module is complete or the compile ended."""
    while True:
        compile_ended = not worker.is_alive()  # read before looking, so no file is missed
        matches = sorted(session.dump_dir.glob(_PARTITIONED_GLOB))
        if not matches and session.num_devices == 1:
            matches = sorted(session.dump_dir.glob(_UNPARTITIONED_GLOB))
        if len(matches) > 1:
            # One graph per warm-up; several would mean torch-xla split the computation.
            raise CaptureError(f"expected one partitioned module, found {len(matches)}: "
                               + ", ".join(path.name for path in matches))
        if matches and (compile_ended or is_complete_hlo_module(matches[0])):
            return matches[0]
        if compile_ended:
            worker.join()
            if matches:
                return matches[0]
            raise CaptureError(
                f"XLA wrote no '{_PARTITIONED_GLOB}' into {session.dump_dir}: was the environment "
                "prepared before torch_xla started, and is SPMD enabled?")
        time.sleep(_POLL_SECONDS)


def is_complete_hlo_module(path: Path) -> bool:
    """True when the HLO text file XLA is writing has been written to its end.

    XLA writes a dump in place, so a reader can see a prefix of it.  HLO text prints the ENTRY
    computation last and closes every computation with a ``}`` in the first column, so the
    file is complete once a ``}`` line closes the ENTRY computation.
    """
    text = path.read_text()
    entry = text.rfind("\nENTRY ")
    return entry >= 0 and "\n}" in text[entry:] and text.rstrip().endswith("}")


def _watch_torch_temp() -> None:
    """Have the watcher also delete torch's temporary directory when this process ends."""
    instantiator = sys.modules.get(_TORCH_TEMP_MODULE)
    temp = getattr(getattr(instantiator, "_TEMP_DIR", None), "name", None)
    for watcher in _watched[-1:]:
        if temp and watcher.stdin is not None and "\n" not in temp:
            try:
                watcher.stdin.write(temp.encode() + b"\n")
                watcher.stdin.flush()
            except OSError:  # the watcher is gone: nothing to tell it
                pass


def release(session: CaptureSession) -> None:
    """Delete the dump directory (XLA also leaves per-kernel CPU files there); a compile still
    running would write into it, so then :func:`end_process` deletes it instead."""
    if not session.compiling:
        shutil.rmtree(session.dump_dir, ignore_errors=True)


def end_process(session: CaptureSession, exit_code: int = 0) -> None:
    """Leave the process now if a capture left XLA compiling; return otherwise.

    The interpreter would wait at exit for the compile, which cannot be cancelled; ``os._exit``
    skips that wait.  Standard streams are flushed and the dump directory removed first; the
    dumps this process wrote are closed files and are kept.
    """
    if not session.compiling:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    shutil.rmtree(session.dump_dir, ignore_errors=True)
    os._exit(exit_code)


def _empty_directory(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def is_stored_data(tensor) -> bool:
    """True when the lazy tensor is a device buffer (or a placeholder), not a computation: its
    root IR node, read from torch-xla's debug info (no walk of the graph)."""
    import torch_xla

    info = torch_xla._XLAC._get_xla_tensor_debug_info(tensor)
    root = next((line for line in info.splitlines() if line.startswith("IR:")), "IR: None")
    return root == "IR: None" or "xla::device_data" in root


def tool_versions() -> dict[str, str]:
    """Versions of the tools that shaped the dump, for the sidecar."""
    import jaxlib
    import torch
    import torch_xla

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_xla": torch_xla.__version__,
        "jaxlib": jaxlib.__version__,
    }


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
