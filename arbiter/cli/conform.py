"""The conformance kit: does a job hold the duty it is given, and say so truthfully?

``arbiter conform PATH`` reads ``conformance.yaml`` (the job's command and its duty specs),
and for each spec starts the job with a control document at duty 1, waits for its first
phase event, writes the spec's duty and nudges it, lets it settle, then measures for
``window_s``: the job's own ``gpu_duty`` reports, and the kit's own measure of its processes
(GPU time where a reader reads it; where the job says its units run on the CPU, the CPU time
of its busiest thread, the time the SDK's Duty counts for a unit on the CPU).  A
spec passes when the job reports the duty it was given, its reports and the kit's measure
both stay within duty + 0.1, and the two agree within 0.1.
Specs whose GPU APIs this host lacks are skipped with the reason.  The job is stopped after
each spec: its document says stop, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from arbiter.config.models import KindBlock, Share
from arbiter.config.validation import load_yaml_mapping, read_text, validate, validate_kind_options
from arbiter.daemon.claim import descendants
from arbiter.engine.usage import busy_share
from arbiter.plugin import GpuReading, PluginContext, Reader
from arbiter.pluginmanager import PluginFailed, PluginHost
from arbiter.probing import gpu_apis, missing_apis
from arbiter.sdk.control import CONTROL_ENV, EVENTS_ENV, NUDGE_SIGNAL, ignore_nudges, write_control_document
from arbiter.sdk.supervisor import signal_group

FILE_NAME = "conformance.yaml"
PAYLOAD_ENV = "ARBITER_PAYLOAD"
TOLERANCE = 0.1
FIRST_PHASE_TIMEOUT_S = 30.0
STOP_GRACE_S = 5.0


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    duty: Share
    window_s: float = Field(8.0, gt=0, le=3600, description="how long the kit measures")
    settle_s: float = Field(2.5, ge=0, description="time after the duty change before measuring")
    payload: dict[str, Any] = Field(default_factory=dict, description=f"passed to the job as JSON in ${PAYLOAD_ENV}")
    apis_any: list[str] = Field(default_factory=list, description="GPU APIs the job needs (one of them)")


class ConformFile(BaseModel):
    """``conformance.yaml``: how to start the job, and the duties to check it at."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(min_length=1, description="argv; {python} is the interpreter running arbiter")
    cwd: str = Field(".", description="relative to this file's folder")
    env: dict[str, str] = Field(default_factory=dict)
    cpu_reader: KindBlock = Field(
        default_factory=lambda: KindBlock(kind="cpu_time", threads=True),
        description="the reader that measures a job whose units run on the CPU",
    )
    specs: list[Spec] = Field(min_length=1)

    def cpu_measure(self) -> str:
        """What ``cpu_reader`` measures, as a result names it."""
        options = self.cpu_reader.options()
        if not options.get("threads"):
            return "CPU time of its processes"
        return "CPU time of its busiest thread"


Verdict = Literal["pass", "fail", "skip"]


@dataclass
class SpecResult:
    name: str
    asked: float
    reported: float | None = None
    measured: float | None = None
    measured_by: str = ""
    #: the share of the window its units took without running: a host too busy to give it
    #: its duty, rather than a job that held back too much
    waited: float | None = None
    verdict: Verdict = "fail"
    why: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "asked": self.asked,
            "reported": self.reported,
            "measured": self.measured,
            "measured_by": self.measured_by,
            "waited": self.waited,
            "verdict": self.verdict,
            "why": self.why,
        }


def load(path: Path) -> tuple[ConformFile, Path]:
    file = path / FILE_NAME if path.is_dir() else path
    data, positions = load_yaml_mapping(read_text(file), str(file))
    return validate(ConformFile, data, str(file), positions), file.parent


def judge(result: SpecResult, reports: list[dict[str, Any]]) -> SpecResult:
    """The verdict from the job's reports and the kit's measure (pure)."""
    if not reports:
        result.why.append("it reported no gpu_duty metric (arbiter.sdk.Duty writes one every 2 s to $ARBITER_EVENTS)")
        return result
    held = sorted({float(r["duty"]) for r in reports})
    if any(abs(d - result.asked) > 1e-9 for d in held):
        result.why.append(
            f"it reports holding duty {', '.join(f'{d:g}' for d in held)}, not the {result.asked:g} it was given"
        )
    result.reported = sum(float(r["busy"]) for r in reports) / len(reports)
    result.waited = sum(float(r.get("waited", 0.0)) for r in reports) / len(reports)
    limit = result.asked + TOLERANCE
    if result.reported > limit:
        result.why.append(f"it reports running at {result.reported:.2f}, over {limit:.2f}")
    if result.measured is None:
        result.why.append(f"the kit cannot measure it: {result.measured_by}")
    else:
        if result.measured > limit:
            result.why.append(f"the kit measured {result.measured:.2f} ({result.measured_by}), over {limit:.2f}")
        if abs(result.measured - result.reported) > TOLERANCE:
            result.why.append(
                f"its reports ({result.reported:.2f}) disagree with the kit's measure ({result.measured:.2f})"
            )
    result.verdict = "fail" if result.why else "pass"
    return result


class Kit:
    def __init__(
        self,
        host: PluginHost,
        readers: list[tuple[str, Reader]],
        say: Callable[[str], None] = lambda _m: None,
        plugins: Sequence[str] = (),
    ) -> None:
        self.host = host
        self._table_scratch: dict[str, Any] = {}
        self.gpu_readers = readers
        self.say = say
        self.plugins = plugins  # the node config's extra plugin modules, for the probes' processes
        self._apis: dict[str, Any] | None = None

    def close(self) -> None:
        self.host.close_scratch(self._table_scratch)

    def _cpu_reader(self, conf: ConformFile) -> Reader:
        info = self.host.kind("readers", conf.cpu_reader.kind)
        if info is None:
            raise PluginFailed(f"readers/{conf.cpu_reader.kind}", "no installed plugin registers it")
        options = validate_kind_options(conf.cpu_reader, info.cls.Options)
        # the job says its units run on the CPU: here a CPU reading is the honest measure
        context = PluginContext(state_dir=Path(tempfile.gettempdir()), stand_in_gpu=True)
        return self.host.call(f"readers/{conf.cpu_reader.kind}", info.cls, options, context)

    def _missing_apis(self, spec: Spec) -> str | None:
        if not spec.apis_any:
            return None
        if self._apis is None:  # probed once per run, each probe in its own process
            self._apis = gpu_apis(self.host.kind_names("probes"), self.plugins)
        why = missing_apis(spec.apis_any, False, self._apis)
        return None if why is None else f"this host cannot run it: {why}"

    def run(self, conf: ConformFile, folder: Path, only: str | None = None) -> list[SpecResult]:
        ignore_nudges()  # inherited by the job until it installs its own handler
        results = []
        for spec in conf.specs:
            if only is not None and spec.name != only:
                continue
            missing = self._missing_apis(spec)
            if missing:
                results.append(SpecResult(spec.name, spec.duty, verdict="skip", why=[missing]))
                continue
            self.say(f"{spec.name}: duty {spec.duty:g}, measuring {spec.window_s:g}s")
            results.append(self._run_spec(conf, folder, spec))
        return results

    def _run_spec(self, conf: ConformFile, folder: Path, spec: Spec) -> SpecResult:
        result = SpecResult(spec.name, spec.duty)
        with tempfile.TemporaryDirectory(prefix="arbiter-conform-") as tmp:
            control, events = Path(tmp) / "control.json", Path(tmp) / "events.jsonl"
            write_control_document(str(control), "run", 1.0, 1, "conformance kit: warming up")
            argv = [sys.executable if a == "{python}" else a for a in conf.command]
            env = {
                **os.environ,
                **conf.env,
                CONTROL_ENV: str(control),
                EVENTS_ENV: str(events),
                PAYLOAD_ENV: json.dumps(spec.payload),
            }
            try:
                proc = subprocess.Popen(argv, cwd=folder / conf.cwd, env=env, start_new_session=True)
            except OSError as exc:
                result.why.append(f"cannot start {argv[0]}: {exc.strerror or exc}")
                return result
            try:
                if not self._wait_for_phase(proc, events):
                    result.why.append(
                        f"it reported no phase within {FIRST_PHASE_TIMEOUT_S:g}s"
                        + (f" (it exited with {proc.returncode})" if proc.poll() is not None else "")
                    )
                    return result
                write_control_document(str(control), "run", spec.duty, 2, f"conformance kit: hold {spec.duty:g}")
                os.kill(proc.pid, NUDGE_SIGNAL)
                time.sleep(spec.settle_s)
                offset = events.stat().st_size
                before = self._tree(proc.pid)
                first = self._read(before, conf)
                time.sleep(spec.window_s)
                # workers that started or ended during the window count: both trees, both readings
                pids = sorted(set(before) | set(self._tree(proc.pid)))
                first = self._read(pids, conf) if pids != before else first
                last = self._read(pids, conf)
                reports = _metrics(events, offset)
                device = reports[-1].get("device", "gpu") if reports else "gpu"
                result.measured, result.measured_by = self._measure(first, last, pids, device, conf.cpu_measure())
                if proc.poll() is not None:
                    result.why.append(f"it exited with {proc.returncode} while being measured")
                    return result
            finally:
                self._stop(proc, control)
        return judge(result, reports)

    @staticmethod
    def _wait_for_phase(proc: subprocess.Popen[bytes], events: Path) -> bool:
        deadline = time.monotonic() + FIRST_PHASE_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if '"phase"' in events.read_text():
                    return True
            except FileNotFoundError:
                pass
            time.sleep(0.02)
        return False

    def _tree(self, root: int) -> list[int]:
        try:
            table = self.host.call(
                "process table", lambda: self.host.hook.arbiter_process_table(scratch=self._table_scratch)
            )
        except PluginFailed:
            table = None
        return descendants(list(table), [root])[root] if table else [root]

    def _read(self, pids: list[int], conf: ConformFile) -> dict[str, GpuReading]:
        out = {}
        for name, reader in self.gpu_readers:
            try:
                out[name] = self.host.call(f"readers/{name}", reader.read, pids)
            except PluginFailed as exc:
                out[name] = GpuReading(readable=False, why=exc.why)
        try:
            cpu = self._cpu_reader(conf)
            out["cpu"] = self.host.call("readers/cpu", cpu.read, pids)
        except (PluginFailed, ValueError) as exc:
            out["cpu"] = GpuReading(readable=False, why=str(exc))
        return out

    @staticmethod
    def _measure(
        first: dict[str, GpuReading], last: dict[str, GpuReading], pids: list[int], device: str, cpu_measure: str
    ) -> tuple[float | None, str]:
        # GPU time wherever a reader reads it, whatever the job says; its CPU time only when
        # no GPU reader reads and the job says its units run on the CPU
        names = [n for n in first if n != "cpu"] + (["cpu"] if device == "cpu" else [])
        whys = []
        for name in names:
            a, b = first[name], last[name]
            if not (a.readable and b.readable):
                whys.append(f"{name}: {b.why or a.why or 'cannot read'}")
                continue
            share = busy_share(
                {p: g.busy_ns for p, g in a.processes.items()},
                a.at_ns,
                {p: g.busy_ns for p, g in b.processes.items()},
                b.at_ns,
                pids,
            )
            if share is not None:
                what = cpu_measure if name == "cpu" else f"GPU time read by {name}"
                return share, what
        return None, "; ".join(whys) or "no reader reads GPU time here, and it says its units run on the GPU"

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes], control: Path) -> None:
        if proc.poll() is None:
            try:
                write_control_document(str(control), "stop", 0.0, 3, "conformance kit: done")
                os.kill(proc.pid, NUDGE_SIGNAL)
                proc.wait(STOP_GRACE_S)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        # the whole group, even once the job itself exited: children it left must not outlive the kit
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not signal_group(proc, sig):
                break
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            if sig == signal.SIGTERM:
                time.sleep(0.2)  # its children's turn to exit on SIGTERM
        proc.wait()


def _metrics(events: Path, offset: int) -> list[dict[str, Any]]:
    """The ``gpu_duty`` metric events written after ``offset``."""
    out = []
    with open(events, "rb") as fh:
        fh.seek(offset)
        for line in fh.read().splitlines():
            try:
                event = json.loads(line)
            except (ValueError, RecursionError):  # a job's garbage line is its own problem, not the kit's
                continue
            if isinstance(event, dict) and event.get("event") == "metric" and event.get("name") == "gpu_duty":
                out.append(event)
    return out
