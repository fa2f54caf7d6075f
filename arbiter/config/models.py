"""The shapes of arbiter's data: node config and rule files (a job's manifest and wire
protocol are in :mod:`arbiter.config.jobdocs`).

Every ``{kind: ...}`` block is validated twice: here as a :class:`KindBlock` (it names a
kind), then against the options model its plugin registered (see :mod:`arbiter.config.rules`).

It runs past 400 lines because the node config and rule files are one schema:
``arbiter schema`` and the generated references read its fields, descriptions and defaults.
"""

from __future__ import annotations

import difflib
import os
import signal
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from arbiter.config.locate import default_state_dir

GpuJobsMode = Literal["never", "when_no_gpu_protected", "certified", "always"]
Scope = Literal["gpu", "cpu", "all", "io"]
Capability = Literal["cooperative_throttle", "cooperative_pause", "cancellable", "progress_events"]
Platform = Literal["darwin", "linux", "windows"]
Share = Annotated[float, Field(ge=0.0, le=1.0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KindBlock(BaseModel):
    """A plugin block: ``kind`` names the plugin kind, the other fields are its options."""

    model_config = ConfigDict(extra="allow")
    kind: str = Field(description="the plugin kind; the other keys of the block are its options")

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class MatchBlock(KindBlock):
    kind: str = Field("process", description="the matcher kind; the other keys of the block are its options")


# --- node config ---------------------------------------------------------------------------


def default_tenants_dirs() -> list[str]:
    if os.geteuid() == 0:
        return ["/etc/arbiter/tenants.d"]
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return [str(Path(base) / "arbiter" / "tenants.d")]


class GovernorConfig(Strict):
    period_s: float = Field(
        60, gt=0, description="how often progress is compared with the baseline and the budget adjusted"
    )
    baseline_s: float = Field(
        60, gt=0, description="how long GPU work is held to measure the protected program's progress without it"
    )
    rebaseline_s: float = Field(1800, gt=0, description="a baseline older than this is measured again")
    take_back_s: float = Field(
        300, ge=0, description="how long the budget stays 0 after a large slowdown or a memory-guard trip"
    )
    grow_step: float = Field(
        0.05,
        gt=0,
        le=1,
        description="the most the budget grows in one period while the program's slowdown is under its aim",
    )


class ComplianceConfig(Strict):
    """How jobs holding a duty below 1 are verified."""

    sample_s: float = Field(2.0, gt=0, le=60, description="how long each sample of a job's measured duty lasts")
    tolerance: Share = Field(0.1, description="measured duty may exceed the asked duty by this much")
    over_samples: int = Field(3, ge=1, description="samples in a row over it before the job is paused")
    pause_s: float = Field(60.0, ge=0, description="how long that pause lasts")
    strikes_to_stop: int = Field(3, ge=1, description="pauses within strike_window_s that stop the job")
    strike_window_s: float = Field(3600.0, gt=0, description="the window in which strikes_to_stop pauses are counted")
    untrusted_s: float = Field(
        3600.0, ge=0, description="how long the jobs of a stopped job's owner and name get no duty"
    )
    still_busy_samples: int = Field(2, ge=1, description="samples a job told to pause may go on using the GPU")


class MemoryGuardConfig(Strict):
    min_available: Share = Field(
        0.10,
        description="the share of host memory that must stay available; below it GPU work beside protected programs is taken back",
    )


class HttpConfig(Strict):
    listen: str = Field(
        "127.0.0.1:7807", description="HOST:PORT of the read-only HTTP listener (port 0 picks a free port)"
    )
    enabled: bool = Field(True, description="false: no HTTP listener at all")

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError("listen must be HOST:PORT, e.g. 127.0.0.1:7807 (port 0 picks a free port)")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class QuotaConfig(Strict):
    """What one account other than root and the daemon's may hold of the daemon at once and
    within a minute, and how much of what ended the daemon keeps: a flood by one local user
    must never starve the daemon of the descriptors, threads, disk or time it needs to pause
    work for a protected program."""

    jobs_per_uid: int = Field(256, ge=1, description="jobs one account may have registered and not ended")
    connections_per_uid: int = Field(
        64,
        ge=1,
        description="socket connections one account may hold open; a quarter of them at most may be held by"
        " `arbiter job run` watching its job (each waits up to 30 s for the job's verdict to change)",
    )
    cmd_bytes: int = Field(
        65536, ge=256, le=1 << 20, description="the most bytes a job's command line (all its words) may have"
    )
    registrations_per_minute: int = Field(
        120, ge=1, description="jobs one account may register or hand over within any minute"
    )
    ended_jobs_kept: int = Field(
        1000,
        ge=1,
        description=(
            "ended jobs whose record and folder are kept (the newest, of every account); older ones go, "
            "as do any ended a day ago"
        ),
    )


class FleetCertificatesConfig(Strict):
    """Certificates shared with twin nodes through a folder every node mounts."""

    folder: str = Field(
        description="the shared folder (NFS, Lustre...) where each node publishes the certificates it earns"
    )
    node_name: str = Field(
        "", description="the name this node publishes under and other nodes list its key by; empty: the host name"
    )
    trusted_keys: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "node name → its public signing key (base64, as `arbiter certificates` prints it there): a certificate "
            "is adopted only when one of these signed it"
        ),
    )
    scan_every_s: float = Field(30.0, gt=0, description="how often the folder is read")
    window_s: float = Field(300.0, gt=0, description="a confirmation run's windows (seconds)")
    washout_s: float = Field(60.0, ge=0, description="the discarded start of each confirmation window (seconds)")
    max_hours: float = Field(8.0, gt=0, description="a confirmation run that takes longer is aborted")

    @field_validator("trusted_keys")
    @classmethod
    def _keys(cls, value: dict[str, str]) -> dict[str, str]:
        import base64
        import binascii

        for node, key in value.items():
            try:
                raw = base64.b64decode(key.strip(), validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"the key listed for {node!r} is not base64") from None
            if len(raw) != 32:
                raise ValueError(
                    f"the key listed for {node!r} is {len(raw)} bytes, not the 32 of an Ed25519 public key "
                    "(copy it from `arbiter certificates` on that node)"
                )
        return value

    @model_validator(mode="after")
    def _window(self) -> FleetCertificatesConfig:
        if self.window_s <= self.washout_s:
            raise ValueError(f"window_s ({self.window_s:g}) must be longer than washout_s ({self.washout_s:g})")
        return self


class NodeConfig(Strict):
    """``arbiter.yaml``: how this node shares its GPU.

    A top-level key that is none of the fields below is the section of a plugin (see plugin
    sections below).
    """

    # a key that is not a field is kept as the file gives it: the sections plugins read are
    # known only once the plugins are, so arbiter.cli.nodecheck judges them, and refuses a
    # key that no enabled plugin reads
    model_config = ConfigDict(extra="allow")

    gpu_jobs: GpuJobsMode = Field(
        "when_no_gpu_protected",
        description=(
            "when GPU fleet work may run: never; when_no_gpu_protected (only while no protected program uses the GPU); "
            "certified (beside a protected program under a budget, where a certificate allows it); always"
        ),
    )
    tick_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="seconds between two full observations and decisions (phase changes do not wait for it)",
    )
    gpu_busy_threshold: Share = Field(
        0.05, description="a protected program uses the GPU once its share of GPU time passes this"
    )
    gpu_release_after_s: float = Field(
        10.0, ge=0, description="...and stops using it once it has stayed below the threshold this long"
    )
    tenants_dirs: list[str] = Field(
        default_factory=default_tenants_dirs,
        description=(
            "folders of rule files, relative to this file; default /etc/arbiter/tenants.d for root, "
            "else $XDG_CONFIG_HOME/arbiter/tenants.d (~/.config/arbiter/tenants.d)"
        ),
    )
    readers: list[str | KindBlock] = Field(
        default_factory=list,
        description="reader kinds tried in order; empty: every installed reader of a real GPU, in name order",
    )
    stand_in_gpu: bool = Field(
        False, description="demos and tests only: lets a stand-in reader (a CPU core for the GPU) count"
    )
    governor: GovernorConfig = Field(
        default_factory=GovernorConfig, description="the budget governor's periods (under gpu_jobs: certified)"
    )
    memory_guard: MemoryGuardConfig = Field(default_factory=MemoryGuardConfig, description="host memory kept free")
    compliance: ComplianceConfig = Field(
        default_factory=ComplianceConfig, description="how jobs holding a duty below 1 are verified"
    )
    admin_group: str = Field(
        "arbiter", description="members of this group may make node-wide changes (A/B runs, reload)"
    )
    plugins: list[str] = Field(
        default_factory=list, description="plugin modules to load besides installed entry points"
    )
    disable_plugins: list[str] = Field(
        default_factory=list, description="plugins (entry point or module names) not to load"
    )
    state_dir: str = Field(
        default_factory=default_state_dir,
        description=(
            "where the database, socket, token and control documents live; default /var/lib/arbiter for root, "
            "else $XDG_STATE_HOME/arbiter (~/.local/state/arbiter)"
        ),
    )
    http: HttpConfig = Field(default_factory=HttpConfig, description="the read-only HTTP listener")
    quotas: QuotaConfig = Field(
        default_factory=QuotaConfig,
        description="what one account other than root and the daemon's may hold at once (jobs, connections)",
    )
    translators: dict[Literal["pause", "control", "terminate"], list[str]] = Field(
        default_factory=dict,
        description=(
            "translator kinds to use per action, in order; the first available here serves. Default: every "
            "installed translator that declares the action, by the rank it declares; one that does not bound its own "
            "time ranks last, since the reflex process needs a pause that does. `arbiter doctor` lists them in order "
            "and `arbiter status` shows the one in use"
        ),
    )
    stop_grace_s: float = Field(10.0, ge=0, description="seconds between asking a job to stop and terminating it")
    evict_after_s: Annotated[float, Field(ge=0)] | Literal["auto"] | None = Field(
        None,
        description=(
            "seconds a running job may stay paused by protection before it is stopped, so that it runs elsewhere: "
            "a terminate translator that hands work back to its scheduler has it requeued (a batch job that may "
            "be requeued), other work ends; auto: the wait that, over the protecting rule's latest protections "
            "here, loses least against evict_cost_s (0 where protection usually outlasts an eviction); null: a "
            "paused job waits however long protection needs"
        ),
    )
    evict_cost_s: float = Field(
        60.0,
        ge=0,
        description=(
            "what an eviction costs a job, in seconds of its work (until it works again on another node, and the "
            "work it loses): evict_after_s: auto weighs it against how long protection lasts; the default is "
            "Slurm's default scheduling interval, measure yours"
        ),
    )
    plugin_timeout_s: float = Field(5.0, gt=0, description="every call into a plugin fails after this many seconds")

    @field_validator("evict_after_s", mode="before")
    @classmethod
    def _evict_after(cls, value: Any) -> Any:
        # one clear error for what is neither seconds nor auto, not one per alternative
        if isinstance(value, str):
            if value != "auto":
                near = difflib.get_close_matches(value, ["auto"], n=1)
                hint = "did you mean 'auto'? " if near else ""
                raise ValueError(f"{value!r} is not a number of seconds; {hint}write seconds, auto or null")
        elif isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"{value:g} is negative: write seconds (0 or more), auto or null")
        return value

    fleet_certificates: FleetCertificatesConfig | None = Field(
        None,
        description=(
            "publish the certificates earned here to a shared folder, and adopt twins' after a confirmation run; "
            "null: neither"
        ),
    )
    reflex_process: bool = Field(
        True,
        description="act on the phase changes of immediate rules in a process of their own, beside the daemon (the "
        "daemon's own work under load delays them); off: the daemon's decision thread acts on them",
    )

    def sections(self) -> dict[str, Any]:
        """The top-level keys that are not fields: plugins' sections, not yet validated."""
        return dict(self.model_extra or {})

    def reader_blocks(self) -> list[KindBlock]:
        return [KindBlock(kind=r) if isinstance(r, str) else r for r in self.readers]

    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()

    def tenants_paths(self) -> list[Path]:
        return [Path(d).expanduser() for d in self.tenants_dirs]


# --- rule files ----------------------------------------------------------------------------


class PauseFleet(Strict):
    scope: Scope = Field(
        "gpu",
        description="the fleet work paused: gpu (jobs that use the GPU), cpu (jobs with gpu.use: none), all or io (every job)",
    )


class Protect(Strict):
    metric: Literal["progress_rate", "gpu_share"] = Field(
        "progress_rate", description="what is guarded: the rate its source reads, or its share of GPU time"
    )
    max_slowdown: float = Field(0.05, gt=0, lt=1, description="the slowdown fleet work may cost it (0.05: 5 %)")
    source: KindBlock | None = Field(
        None, description="a source block: where its progress is read (needed for progress_rate)"
    )

    @model_validator(mode="after")
    def _source_for_rate(self) -> Protect:
        if self.metric == "progress_rate" and self.source is None:
            raise ValueError("metric progress_rate needs a source (where the program's progress is read)")
        return self


class During(Strict):
    source: KindBlock = Field(description="a source block that reports a phase (on, off, soon)")
    pause_fleet: PauseFleet = Field(
        default_factory=PauseFleet, description="the fleet work paused while the phase is on"
    )
    tags: list[str] = Field(default_factory=list, description="labels shown with the phase in status and the timeline")


class Eviction(Strict):
    """How fleet work this rule's protection evicts (``evict_after_s``) saves its work before
    it is stopped; each setting left out is the node's (a translator's own section)."""

    checkpoint_signal: str | None = Field(
        None,
        description="the signal an evicted job is given to save its work, as a batch scheduler's --signal takes "
        "it (USR1, SIGUSR1, B:USR1 for a batch job's shell alone); null: the node's setting, else the job's own",
    )
    checkpoint_s: float | None = Field(
        None,
        ge=0,
        le=600,
        allow_inf_nan=False,
        description="the longest an evicted job given its checkpoint signal runs on before it is stopped; "
        "null: the node's setting",
    )

    @field_validator("checkpoint_signal")
    @classmethod
    def _a_signal(cls, value: str | None) -> str | None:
        if value is None:
            return value
        flags, _, name = value.rpartition(":")
        if flags not in ("", "B", "R", "BR", "RB"):
            raise ValueError(f"{value!r}: before the ':' only B (the batch shell) or R may stand, like B:USR1")
        bare = name.upper().removeprefix("SIG")
        known = sorted(s.name.removeprefix("SIG") for s in signal.Signals if not s.name.startswith("SIG_"))
        if bare not in known and not bare.isdigit():
            near = difflib.get_close_matches(bare, known, n=1)
            hint = f"; did you mean {near[0]}?" if near else f" (signals: {', '.join(known)})"
            raise ValueError(f"{name!r} is not a signal name{hint}")
        return value


class Rule(Strict):
    """One tenant: how to recognise it, how much it matters, and what protects it."""

    id: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=64,
        description="the tenant's name, unique across the tenants dirs",
    )
    extends: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=64,
        description=(
            "the id of a rule in another rule file of the tenants dirs that this file builds on: write only "
            "the fields that change, and every other field, including ones a later version adds to that "
            "file, comes from it. Mappings merge key by key (a plugin block whose kind changes is replaced "
            "whole); lists, values and null replace. The base then no longer loads by itself, and the rule "
            "keeps the base's id unless this file sets its own id. A base can be extended once; an "
            "extension can itself be extended."
        ),
    )
    kind: Literal["llm", "diffusion", "desktop", "trainer", "other"] = Field(
        "other", description="what sort of program it is (advisory)"
    )
    enabled: bool = Field(True, description="false: the rule is kept but claims no process")
    priority: int = Field(
        50,
        ge=0,
        le=1000,
        description=(
            "higher wins contention: a process belongs to the first matching rule by priority (then id), "
            "except one inside the tree of a rule with a tree-walking match (tree: descendants), which goes "
            "with that rule (the outermost tree first) unless the rule that selects it ranks higher"
        ),
    )
    match: MatchBlock = Field(description="a matcher block: which processes are this tenant's")
    immediate: bool = Field(
        False, description="true: a during phase pauses fleet work the moment it begins, between ticks"
    )
    protect: Protect | None = Field(
        None, description="makes it a protected program: what of it fleet work must not slow"
    )
    during: list[During] = Field(
        default_factory=list, description="phases (an upload, a render) that pause fleet work while on"
    )
    pause_fleet: PauseFleet | None = Field(None, description="fleet work paused whenever its program runs")
    eviction: Eviction | None = Field(
        None,
        description="how fleet work its protection holds past evict_after_s saves its work before it is stopped "
        "(the checkpoint signal and time; null: the node's settings)",
    )
    base_url: str | None = Field(
        None,
        description=(
            "where the program answers, e.g. http://127.0.0.1:8000: a url of its blocks that is a path "
            "(/metrics) is taken from here, so another port is one line of an extension"
        ),
    )
    busy: KindBlock | None = Field(None, description="a source block (busy probe): whether the tenant is working now")
    release: KindBlock | None = Field(None, description="a translator block: how it is asked to give its VRAM back")
    reacquire: KindBlock | None = Field(
        None,
        description=(
            "a translator block: how it takes its VRAM back after a release made for another tenant "
            "(a server put to sleep told to wake up), once no one needs that VRAM"
        ),
    )
    reacquire_after_s: float = Field(
        10, ge=0, le=86400, description="how long no one may need the released VRAM before it is woken"
    )
    release_when_busy: Literal["release", "wait", "skip"] = Field(
        "release",
        description=(
            "what a handoff does with it while it is busy (or its state is unknown): release (its server copes, "
            "or its release drains by itself), wait (released once its probe reads idle, for at most "
            "drain_timeout_s; then other tenants are taken) or skip (never released busy: other tenants are taken)"
        ),
    )
    drain_timeout_s: float = Field(
        60, gt=0, le=86400, description="with release_when_busy: wait, how long a handoff waits for it to be idle"
    )
    events: KindBlock | None = Field(
        None, description="a source block whose every message makes the busy probe read again at once"
    )
    needs_vram_gb: float | None = Field(
        None, ge=0, description="VRAM it needs while busy; short of it, other tenants' VRAM is reclaimed"
    )
    idle_release_after_s: float = Field(30, ge=0, description="once idle this long, its VRAM counts as reclaimable")
    profile: KindBlock | None = Field(
        None, description="a translator block: a GPU profile (power, clocks) applied while it works on the GPU"
    )
    notes: str = Field("", description="free text for people; shown by explain")

    @property
    def protected(self) -> bool:
        return self.protect is not None

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith(("http://", "https://")) or "?" in value or "#" in value):
            raise ValueError(f"base_url is a scheme, host and port, like http://127.0.0.1:8000 (got {value!r})")
        return value

    @model_validator(mode="after")
    def _way_back_needs_a_release(self) -> Rule:
        if self.reacquire is not None and self.release is None:
            raise ValueError("reacquire: undoes a release: add a release: block (how it gives its VRAM back)")
        if self.release_when_busy != "release" and self.release is None:
            raise ValueError(
                f"release_when_busy: {self.release_when_busy} says when a release is safe: add a release: block "
                "(how it gives its VRAM back)"
            )
        return self
