"""``control_doc``: tell a cooperative job what to do through its control document."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

from arbiter.plugin import (
    NUDGE_SIGNAL,
    ControlUpdate,
    JobTarget,
    KindOptions,
    PluginContext,
    PluginError,
    ProcessRef,
    Translator,
    write_control_document,
)
from arbiter_translators.identity import Signaller


class ControlDocOptions(KindOptions):
    kind: Literal["control_doc"] = "control_doc"


class ControlDocTranslator(Translator):
    """Writes the job's control document atomically, then nudges a cooperative job's root."""

    Options = ControlDocOptions
    actions = frozenset({"control"})

    def __init__(self, options: ControlDocOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self._signaller = Signaller()

    def pause_effect(self, refs: Sequence[ProcessRef]) -> str:
        return (
            "it was asked to pause at its next safe point: it submits no GPU work while paused, and its VRAM stays "
            "allocated unless the job itself frees it"
        )

    def control(self, target: JobTarget, update: ControlUpdate, seq: int) -> None:
        if not target.control_path:
            raise PluginError(
                f"job {target.name!r} ({target.job_id}) has no control document path, so control_doc "
                "cannot reach it; start it through arbiter (which sets ARBITER_CONTROL) or register "
                "it with a control path"
            )
        own = self.context.state_dir / "jobs" / target.job_id / "control.json"
        if (
            "/" in target.job_id
            or target.job_id in ("", ".", "..")
            or os.path.normpath(target.control_path) != str(own)
        ):
            # a record of another daemon's, or one someone else wrote, never has root write elsewhere
            raise PluginError(
                f"job {target.name!r} ({target.job_id}): its control document path {target.control_path} is not "
                f"{own}, where arbiter keeps it; nothing was written"
            )
        try:
            write_control_document(target.control_path, update.state, update.gpu_duty, seq, update.reason)
        except ValueError as exc:
            raise PluginError(f"job {target.name!r}: {exc}") from None
        except OSError as exc:
            raise PluginError(
                f"cannot write the control document of job {target.name!r} at {target.control_path}: "
                f"{exc.strerror or exc}; its directory must exist and be writable by the daemon"
            ) from None
        # Only a cooperative job installs the nudge handler; to any other the signal's
        # default action would end it.  It reads the document at its next safe point anyway.
        if target.cooperative and target.processes:
            root = target.processes[0]
            try:
                self._signaller.send(root, NUDGE_SIGNAL)
            except (OSError, ValueError) as exc:
                raise PluginError(
                    f"wrote the control document of job {target.name!r} but could not nudge pid "
                    f"{root.pid}: {exc}; the job sees the change at its next poll"
                ) from None
