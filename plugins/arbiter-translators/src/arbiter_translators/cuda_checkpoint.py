"""``cuda_checkpoint``: a pause that gives a CUDA job's VRAM back, through NVIDIA's driver.

A stopped process (SIGSTOP, a frozen cgroup) still holds its device memory, so a protected
program that needs it starves all the same.  This translator first has the driver lock the
job's CUDA work (its already submitted work runs to completion, later CUDA calls block),
checkpoint it (its device memory is copied into host memory and every GPU allocation and
handle is released), and only then stops its processes.  A resume continues them first and
then restores (device memory copied back to the same addresses) and unlocks: the driver does
this work on a thread inside the job's own process, which must be running for it.

Where the driver cannot (no driver, one older than the checkpoint calls, a process holding
IPC or unified memory, submitted work that does not finish within ``lock_timeout_ms``) the
job is paused as ``signal`` pauses it, its VRAM stays allocated, and the timeline and
``arbiter explain`` say why.

A process that was restored is checkpointed again before it is killed: killing a restored
CUDA process has been reported to hang hosts, and a checkpointed one holds nothing on the
device.  SIGTERM is sent as it is: the job ends through its own CUDA teardown.

Checkpointing copies the job's device memory to host memory (seconds for tens of GiB): the
daemon's ``plugin_timeout_s`` must cover it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from arbiter.plugin import JobTarget, PluginContext, PluginError, ProcessRef
from arbiter_translators.cuda_driver import (
    Checkpointer,
    CheckpointRefused,
    DriverCheckpointer,
    format_version,
    open_checkpointer,
)
from arbiter_translators.signals import SignalOptions, SignalTranslator

CHECKPOINTED = "GPU_MEMORY_CHECKPOINTED"
RESTORED = "GPU_MEMORY_RESTORED"
NOT_FREED = "GPU_CHECKPOINT_FAILED"
#: what a plain pause frees, for ``explain``
HELD = (
    "its processes are stopped: GPU work it had already queued runs to completion, then it submits none; "
    "the VRAM it holds stays allocated"
)


class CudaCheckpointOptions(SignalOptions):
    kind: Literal["cuda_checkpoint"] = "cuda_checkpoint"  # type: ignore[assignment]
    backend: Literal["auto", "driver", "utility"] = Field(
        "auto", description="the driver library's checkpoint calls, the cuda-checkpoint utility, or the first found"
    )
    library: str = Field("libcuda.so.1", description="the CUDA driver library")
    utility: str = Field("cuda-checkpoint", description="NVIDIA's cuda-checkpoint utility (name on PATH, or a path)")
    lock_timeout_ms: int = Field(
        3000, ge=1, le=600_000, description="how long a lock waits for the job's submitted GPU work to finish"
    )


class CudaCheckpointTranslator(SignalTranslator):
    """Checkpoints a CUDA job's device memory, then stops it; restores it after continuing it
    (see the module).  Every method is idempotent: each acts on the driver's state of each
    process as it finds it."""

    Options = CudaCheckpointOptions
    actions = frozenset({"pause", "resume", "terminate", "kill"})
    bounded = False  # a checkpoint copies gigabytes, and a lock waits for the job's GPU work
    rank = 900  # unbounded: only where the node config names it
    frees_vram = True

    def __init__(self, options: CudaCheckpointOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self.options: CudaCheckpointOptions = options
        self.driver: Checkpointer | None
        self.driver, self.why_not = open_checkpointer(options.backend, options.library, options.utility)
        self._lock = threading.Lock()  # one step at a time: a retried pause waits for the one in progress
        self._effects: dict[ProcessRef, str] = {}  # what each paused CUDA process's pause did, for explain
        self._record = context.state_dir / "cuda_checkpoint.json"

    def available(self) -> tuple[bool, str]:
        ok, why = super().available()
        if not ok:
            return ok, why
        if self.driver is None:
            return True, f"pauses free no VRAM here ({self.why_not}): jobs are paused with signals only"
        version = getattr(self.driver, "version", None)
        through = f"the driver library ({format_version(version)})" if version else "the cuda-checkpoint utility"
        return True, f"pauses checkpoint CUDA jobs through {through}"

    # --- pause and resume ---------------------------------------------------------------------

    def pause(self, target: JobTarget) -> list[ProcessRef]:
        with self._lock:
            if self.driver is not None:
                for ref in target.processes:
                    if self._alive(ref):
                        self._checkpoint(self.driver, target.job_id, ref)
            return super().pause(target)

    def _checkpoint(self, driver: Checkpointer, job_id: str, ref: ProcessRef) -> bool:
        """Lock and checkpoint one process; False (and why, on the timeline) where the driver
        could not, leaving it locked where the lock held (it submits no GPU work while paused)."""
        state = driver.state(ref.pid)
        if state is None:
            return False  # no CUDA state in this process: stopping it is all a pause needs
        if state == "checkpointed":
            self._effects[ref] = self._freed_text(0.0)
            return True
        started = time.monotonic()
        try:
            if state == "running":
                driver.lock(ref.pid, self.options.lock_timeout_ms)
            elif state != "locked":
                raise CheckpointRefused(
                    "checkpoint", ref.pid, f"process state {state}", "the driver cannot checkpoint it"
                )
            driver.checkpoint(ref.pid)
        except CheckpointRefused as exc:
            self._effects[ref] = f"{HELD}: the driver did not checkpoint pid {ref.pid}: {self._why_refused(exc)}"
            self._note(job_id, NOT_FREED, self._effects[ref], {"pid": ref.pid, "step": exc.step, "error": exc.name})
            return False
        took = time.monotonic() - started
        self._effects[ref] = self._freed_text(took)
        self._note(
            job_id,
            CHECKPOINTED,
            f"pid {ref.pid} checkpointed in {took:.2f}s: its device memory is in host memory and its VRAM is free",
            {"pid": ref.pid, "seconds": round(took, 3), "via": driver.name},
        )
        return True

    def _freed_text(self, took: float) -> str:
        return (
            "its CUDA work was locked and checkpointed"
            + (f" in {took:.2f}s" if took else "")
            + ": GPU work it had queued ran to completion, its device memory was copied to host memory and its VRAM "
            "released; then its processes were stopped (SIGSTOP)"
        )

    def _why_refused(self, exc: CheckpointRefused) -> str:
        if exc.timed_out:
            return (
                f"its submitted GPU work did not finish within lock_timeout_ms {self.options.lock_timeout_ms} "
                f"({exc.name}); it stays locked, submitting no GPU work, until it is resumed"
            )
        if exc.unsupported:
            return (
                f"the driver cannot checkpoint its memory ({exc.name}: IPC or unified memory, or a GPU "
                "the driver does not checkpoint); it stays locked until it is resumed"
            )
        return f"{exc.step} failed: {exc.name}" + (f" ({exc.text})" if exc.text else "")

    def resume(self, refs: Sequence[ProcessRef]) -> None:
        with self._lock:
            errors: list[str] = []
            try:
                super().resume(refs)  # first: the driver restores on a thread of the job's own
            except PluginError as exc:
                errors.append(str(exc))
            restored: list[ProcessRef] = []
            for ref in refs:
                self._effects.pop(ref, None)
                if self.driver is None or not self._alive(ref):
                    continue
                try:
                    state = self.driver.state(ref.pid)
                    started = time.monotonic()
                    if state == "checkpointed":
                        self.driver.restore(ref.pid)
                        restored.append(ref)
                        state = "locked"
                    if state == "locked":
                        self.driver.unlock(ref.pid)
                except CheckpointRefused as exc:
                    errors.append(f"could not restore pid {ref.pid}: {exc}")
                    self._note(
                        "",
                        NOT_FREED,
                        f"pid {ref.pid} was continued but its CUDA state was not restored: {exc}",
                        {"pid": ref.pid, "step": exc.step, "error": exc.name},
                    )
                    continue
                if ref in restored:
                    took = time.monotonic() - started
                    self._note(
                        "",
                        RESTORED,
                        f"pid {ref.pid} restored in {took:.2f}s: its device memory is back on the GPU",
                        {"pid": ref.pid, "seconds": round(took, 3)},
                    )
            if restored:
                self._remember(restored)
            if errors:
                raise PluginError("; ".join(errors))

    # --- ending a job -------------------------------------------------------------------------

    def kill(self, target: JobTarget) -> None:
        with self._lock:
            if self.driver is not None:
                known = self._restored()
                for ref in target.processes:
                    restored = known.get(str(ref.pid)) == ref.start_time and self._alive(ref)
                    if restored and self.driver.state(ref.pid) in ("running", "locked"):
                        self._checkpoint(self.driver, target.job_id, ref)
        super().kill(target)

    # --- what explain says --------------------------------------------------------------------

    def pause_effect(self, refs: Sequence[ProcessRef]) -> str:
        said = [self._effects[r] for r in refs if r in self._effects]
        # paused by an earlier daemon: the driver's state says what its pause did (a library
        # call that returns at once; the utility would be a process per look)
        driver = self.driver if isinstance(self.driver, DriverCheckpointer) else None
        if not said and driver and any(driver.state(r.pid) == "checkpointed" for r in refs if self._alive(r)):
            said = [self._freed_text(0.0)]
        if not said:
            if self.driver is None:
                return f"{HELD} ({self.why_not})"
            return f"{HELD}: the driver knows no CUDA state in its processes, so there was nothing to checkpoint"
        return "; ".join(dict.fromkeys(said))

    # --- helpers ------------------------------------------------------------------------------

    def _alive(self, ref: ProcessRef) -> bool:
        try:
            return self._signaller.send(ref, 0)  # signal 0: only the start-time check
        except (OSError, ValueError):
            return False

    def _note(self, job_id: str, code: str, message: str, data: Mapping[str, Any]) -> None:
        report = self.context.note
        if report is None:
            return
        try:
            report(job_id, code, message, dict(data))
        except Exception:  # reporting must never stop the pause itself
            pass

    def _restored(self) -> dict[str, float]:
        """The processes this translator restored, by pid (with their start times), as
        recorded in the state folder: they outlive a daemon restart."""
        try:
            data = json.loads(self._record.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _remember(self, refs: Sequence[ProcessRef]) -> None:
        known = {pid: at for pid, at in self._restored().items() if self._alive(ProcessRef(int(pid), at))}
        known.update({str(r.pid): r.start_time for r in refs})
        tmp = self._record.with_name(f".{self._record.name}.tmp")
        try:
            tmp.write_text(json.dumps(known))
            os.replace(tmp, self._record)
        except OSError:
            pass  # a kill then signals without the fresh checkpoint: the timeline said it was restored
