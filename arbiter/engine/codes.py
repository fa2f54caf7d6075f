"""Every code a reason or a timeline entry carries, with what it means and what to do.

The names below are what the engine, the daemon and the plugins write; :data:`CATALOGUE`
says, for each, whether it is a *hold* (a reason a job waits, is paused, limited or
stopped: ``arbiter explain`` shows it), a *problem* (something failing that the status,
``doctor`` and the timeline show, and that holds GPU fleet work where it touches protection)
or an *event* (a timeline entry), with a general remedy.  A reason's own remedy names the
rule, job or file at hand; the catalogue's says what to do in general.  ``docs/codes.md`` is
generated from it, and a test fails for a code written anywhere that it does not list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GPU_DUTY_START = "GPU_DUTY_START"
GPU_DUTY_BASELINE = "GPU_DUTY_BASELINE"
GPU_DUTY_GROW = "GPU_DUTY_GROW"
GPU_DUTY_HALVE = "GPU_DUTY_HALVE"
GPU_DUTY_TAKE_BACK = "GPU_DUTY_TAKE_BACK"
GPU_DUTY_CLAMP = "GPU_DUTY_CLAMP"
GPU_DUTY_EXCEEDED = "GPU_DUTY_EXCEEDED"
GPU_DUTY_UNVERIFIED = "GPU_DUTY_UNVERIFIED"
GPU_NOT_CERTIFIED = "GPU_NOT_CERTIFIED"
GPU_API_UNAVAILABLE = "GPU_API_UNAVAILABLE"
PROTECTION_PHASE_ON = "PROTECTION_PHASE_ON"
PROTECTION_PHASE_OFF = "PROTECTION_PHASE_OFF"
PROTECTION_PHASE_SOON = "PROTECTION_PHASE_SOON"
PROTECTION_SOURCE_UNREADABLE = "PROTECTION_SOURCE_UNREADABLE"
PROTECTION_SOURCE_NEEDS_HELPER = "PROTECTION_SOURCE_NEEDS_HELPER"
PROTECTION_GPU_ON = "PROTECTION_GPU_ON"
PROTECTION_GPU_OFF = "PROTECTION_GPU_OFF"
PROTECTED_GPU_BUSY = "PROTECTED_GPU_BUSY"
RULE_PAUSE_FLEET = "RULE_PAUSE_FLEET"
#: explain: a rule's source advances while no process matches its match: (a program it misses)
RULE_MATCHES_NOTHING = "RULE_MATCHES_NOTHING"
GPU_JOBS_NEVER = "GPU_JOBS_NEVER"
GPU_EXCLUSIVE_WAIT = "GPU_EXCLUSIVE_WAIT"
JOB_HELD = "JOB_HELD"
JOB_HELD_BY_USER = "JOB_HELD_BY_USER"
JOB_ADMITTED = "JOB_ADMITTED"
JOB_PAUSED = "JOB_PAUSED"
JOB_RESUMED = "JOB_RESUMED"
JOB_STOPPED = "JOB_STOPPED"
JOB_EVICTED = "JOB_EVICTED"
JOB_EXITED = "JOB_EXITED"
JOB_ADOPTED = "JOB_ADOPTED"
JOB_UNTRUSTED = "JOB_UNTRUSTED"
VRAM_RELEASE_REQUESTED = "VRAM_RELEASE_REQUESTED"
VRAM_RELEASED = "VRAM_RELEASED"
VRAM_RELEASE_FAILED = "VRAM_RELEASE_FAILED"
VRAM_REACQUIRE_REQUESTED = "VRAM_REACQUIRE_REQUESTED"
VRAM_REACQUIRED = "VRAM_REACQUIRED"
VRAM_REACQUIRE_FAILED = "VRAM_REACQUIRE_FAILED"
VRAM_REACQUIRE_WAITING = "VRAM_REACQUIRE_WAITING"
VRAM_RELEASE_DRAINING = "VRAM_RELEASE_DRAINING"
PROFILE_APPLIED = "PROFILE_APPLIED"
PROFILE_RESTORED = "PROFILE_RESTORED"
AB_BLOCK_DONE = "AB_BLOCK_DONE"
AB_BLOCK_EXCLUDED = "AB_BLOCK_EXCLUDED"
AB_RUN_STARTED = "AB_RUN_STARTED"
AB_RUN_SIZED = "AB_RUN_SIZED"
AB_RUN_EXTENDED = "AB_RUN_EXTENDED"
AB_RUN_DONE = "AB_RUN_DONE"
AB_EFFECT_CHANGED = "AB_EFFECT_CHANGED"
AB_ENDS_NOT_SHOWN = "AB_ENDS_NOT_SHOWN"
AB_SWEEP_DONE = "AB_SWEEP_DONE"
AB_WINDOW_OFF = "AB_WINDOW_OFF"
AB_RUN_MEASURING = "AB_RUN_MEASURING"
CERT_ISSUED = "CERT_ISSUED"
CERT_SUPERSEDED = "CERT_SUPERSEDED"
CERT_NOT_ISSUED = "CERT_NOT_ISSUED"
FLEET_CERT_PUBLISHED = "FLEET_CERT_PUBLISHED"
FLEET_CERT_NOT_PUBLISHED = "FLEET_CERT_NOT_PUBLISHED"
FLEET_CERT_CONFIRMING = "FLEET_CERT_CONFIRMING"
FLEET_CERT_ADOPTED = "FLEET_CERT_ADOPTED"
FLEET_CERT_REFUSED = "FLEET_CERT_REFUSED"
FLEET_CERT_MISMATCH = "FLEET_CERT_MISMATCH"
FLEET_CERT_CORRUPT = "FLEET_CERT_CORRUPT"
FLEET_CERT_UNTRUSTED = "FLEET_CERT_UNTRUSTED"
FLEET_CERT_REPLAYED = "FLEET_CERT_REPLAYED"
CONFIG_RELOADED = "CONFIG_RELOADED"
CONFIG_REJECTED = "CONFIG_REJECTED"
PLUGIN_FAILED = "PLUGIN_FAILED"
GPU_MEMORY_CHECKPOINTED = "GPU_MEMORY_CHECKPOINTED"
GPU_MEMORY_RESTORED = "GPU_MEMORY_RESTORED"
GPU_CHECKPOINT_FAILED = "GPU_CHECKPOINT_FAILED"
ENDPOINT_REFUSED = "ENDPOINT_REFUSED"
PID_REUSED = "PID_REUSED"
GPU_TIME_UNREADABLE = "GPU_TIME_UNREADABLE"
CLOCK_JUMPED = "CLOCK_JUMPED"
STATE_WRITE_FAILED = "STATE_WRITE_FAILED"
DAEMON_STARTED = "DAEMON_STARTED"
DAEMON_STOPPED = "DAEMON_STOPPED"
VRAM_HANDOFF_PLANNED = "VRAM_HANDOFF_PLANNED"
JOB_PAUSED_FOR_VRAM = "JOB_PAUSED_FOR_VRAM"
VRAM_HANDOFF_BLOCKED = "VRAM_HANDOFF_BLOCKED"

Kind = Literal["hold", "problem", "event"]


@dataclass(frozen=True)
class Code:
    name: str
    kind: Kind
    #: what it means, one sentence
    meaning: str
    #: what to do about it in general ("" for an event that asks nothing)
    remedy: str = ""


CATALOGUE: tuple[Code, ...] = (
    # --- why GPU fleet work waits or is paused ---
    Code(
        PROTECTED_GPU_BUSY,
        "hold",
        "A protected program uses the GPU: GPU fleet work waits until it has stayed below "
        "`gpu_busy_threshold` for `gpu_release_after_s`.",
        "Nothing to do: the work starts once the program is done; `arbiter explain RULE` shows its GPU share.",
    ),
    Code(
        PROTECTION_PHASE_ON,
        "hold",
        "A `protect.source` or `during:` phase of a protected rule is on.",
        "Wait for the phase to end; the rule's source says when (`arbiter status`).",
    ),
    Code(
        PROTECTION_PHASE_SOON,
        "hold",
        "A phase is announced to begin shortly: work that would not finish first waits.",
        "Wait for the phase to pass.",
    ),
    Code(
        PROTECTION_SOURCE_UNREADABLE,
        "hold",
        "A protected rule's source cannot be read: it counts as on, so fleet work is held.",
        "Make the source readable (path, permissions, the program writing it); `arbiter doctor` names it.",
    ),
    Code(
        PROTECTION_SOURCE_NEEDS_HELPER,
        "hold",
        "A protected rule's source lies in a home the daemon's account cannot read: it counts as on.",
        "Run `arbiter helper` in that user's login (or give the daemon's account read access).",
    ),
    Code(
        RULE_PAUSE_FLEET,
        "hold",
        "A rule's `during:` phase pauses GPU fleet work while it is on.",
        "Wait for the phase to end.",
    ),
    Code(
        GPU_JOBS_NEVER,
        "hold",
        "The node config says `gpu_jobs: never`: no GPU fleet work runs here.",
        "Set `gpu_jobs` in the node config to another value and restart the daemon.",
    ),
    Code(
        GPU_EXCLUSIVE_WAIT,
        "hold",
        "A job that wants the GPU to itself waits for another GPU job, or a job waits for an exclusive one.",
        "Wait for the other job to end, or declare the job's GPU use as `shared` in its manifest.",
    ),
    Code(
        GPU_NOT_CERTIFIED,
        "hold",
        "Under `gpu_jobs: certified`, no valid certificate lets this job run beside the protected program.",
        "Earn one with `arbiter ab sweep --rule RULE`; `arbiter certificates` shows why one is missing or stale.",
    ),
    Code(
        GPU_API_UNAVAILABLE,
        "hold",
        "The job needs a GPU API this host cannot provide (its health is undetected, not an alert).",
        "Run it on a host that has the API, or change the manifest's `gpu.apis_any`; `arbiter gpu-apis` shows what is here.",
    ),
    Code(
        JOB_HELD,
        "hold",
        "The job waits to be admitted.",
        "`arbiter explain JOB` lists every reason it waits.",
    ),
    Code(
        JOB_HELD_BY_USER,
        "hold",
        "The job's owner paused it.",
        "`arbiter job resume JOB`.",
    ),
    Code(
        JOB_STOPPED,
        "hold",
        "The job was asked to stop, or stopped.",
        "Start it again with `arbiter job run`.",
    ),
    Code(
        JOB_EVICTED,
        "hold",
        "Protection paused a running job for longer than `evict_after_s`: it is stopped so that its "
        "scheduler can run it elsewhere.",
        "Raise `evict_after_s`, or let the scheduler requeue the job.",
    ),
    Code(
        JOB_UNTRUSTED,
        "hold",
        "Jobs of this name went over their duty too often: they are held until the distrust expires.",
        "Fix the job so that it follows its duty (the `arbiter.sdk` duty helpers), then wait out the distrust.",
    ),
    Code(
        JOB_PAUSED_FOR_VRAM,
        "hold",
        "The job is paused so that its VRAM goes to a tenant short of memory.",
        "Wait for the tenant's work to end.",
    ),
    Code(
        AB_WINDOW_OFF,
        "hold",
        "A paired run measures an OFF window: the work is held for the window.",
        "Wait for the window to end; `arbiter ab status` shows the run.",
    ),
    Code(
        AB_RUN_MEASURING,
        "hold",
        "A paired run measures: other GPU work waits so that it does not disturb the measure.",
        "Wait for the run, or `arbiter ab abort RUN`.",
    ),
    Code(
        VRAM_REACQUIRE_WAITING,
        "hold",
        "A tenant released for a handoff is not woken yet, and why.",
        "Wait; the reason says what it waits for.",
    ),
    Code(
        VRAM_RELEASE_DRAINING,
        "hold",
        "A busy tenant's server must not be released while it works (its rule says so): the plan waits "
        "for it to go idle, or drains it first, or releases another tenant.",
        "Wait; `arbiter explain TENANT` says what the tenant is doing and how long the plan waits.",
    ),
    Code(
        GPU_DUTY_EXCEEDED,
        "hold",
        "A job used more GPU time than its duty allows.",
        "Make the job follow its duty (the `arbiter.sdk` duty helpers).",
    ),
    Code(
        GPU_DUTY_UNVERIFIED,
        "hold",
        "A job's GPU time cannot be measured, so its duty cannot be checked.",
        "Install a reader that measures per-process GPU time (`arbiter doctor`).",
    ),
    Code(
        GPU_DUTY_CLAMP,
        "hold",
        "The governor limits the job's duty below what it asked.",
        "Nothing to do: the budget grows while the protected program keeps its speed.",
    ),
    Code(
        GPU_DUTY_BASELINE,
        "hold",
        "A governor measures the protected program's speed with GPU fleet work held, to judge the budget by it.",
        "Wait: the measure takes one governor period.",
    ),
    Code(
        GPU_DUTY_HALVE,
        "hold",
        "The protected program slowed past `max_slowdown`: the governor cut the budget by the overshoot.",
        "Nothing to do: the budget grows again while the program keeps its speed.",
    ),
    Code(
        GPU_DUTY_TAKE_BACK,
        "hold",
        "A larger slowdown, or host memory running short: the governor took the budget back for `take_back_s`.",
        "Wait for `take_back_s`; free host memory if the reason names it.",
    ),
    # --- failures, shown in the status, doctor and the timeline ---
    Code(
        PLUGIN_FAILED,
        "problem",
        "A plugin failed or timed out; where it touches protection, GPU fleet work is held.",
        "Read the message and the daemon's log; `arbiter doctor` checks every plugin.",
    ),
    Code(
        GPU_TIME_UNREADABLE,
        "problem",
        "No reader can measure GPU time: protected programs count as busy (fail safe).",
        "Install the GPU's driver or a reader plugin that reads it; `arbiter doctor` says which reader fails and why.",
    ),
    Code(
        RULE_MATCHES_NOTHING,
        "problem",
        "A rule's source advances while no process matches its `match:` block: the rule protects nothing.",
        "`arbiter rules RULE` shows what its match: selects now and the near misses, with the field that missed.",
    ),
    Code(
        CONFIG_REJECTED,
        "problem",
        "A rule file has an error: the last good version stays in force.",
        "`arbiter check` points at the file, line and field.",
    ),
    Code(
        STATE_WRITE_FAILED,
        "problem",
        "The state directory is full or read-only: protection goes on, unrecorded.",
        "Free space on its file system or make it writable again.",
    ),
    Code(
        CLOCK_JUMPED,
        "problem",
        "The wall clock moved against the monotonic one (it was set, or the machine slept).",
        "Nothing to do; times on the timeline around it may be off.",
    ),
    Code(
        ENDPOINT_REFUSED,
        "problem",
        "A rule's headers (a secret among them) or its release were not sent: the socket at its URL is not "
        "its program's, or its owner could not read the secret itself.",
        "Start the rule's program so that it listens there, or give the secret file to the account the program "
        "runs as; the message names the socket's owner.",
    ),
    Code(
        PID_REUSED,
        "problem",
        "A recorded process's pid now names another process: no signal was sent to it.",
        "Nothing to do: the recorded process is gone.",
    ),
    Code(
        VRAM_RELEASE_FAILED,
        "problem",
        "A tenant did not release its VRAM when asked.",
        "Check the tenant's server and the rule's `release:` block; the message says what failed.",
    ),
    Code(
        VRAM_REACQUIRE_FAILED,
        "problem",
        "A released tenant could not be given its VRAM back.",
        "Check the tenant's server and the rule's `reacquire:` block.",
    ),
    Code(
        VRAM_HANDOFF_BLOCKED,
        "problem",
        "A tenant short of VRAM cannot be covered by any release: nothing is released.",
        "Free VRAM by hand, or give lower-ranked tenants a `release:` block.",
    ),
    Code(
        GPU_CHECKPOINT_FAILED,
        "problem",
        "The driver could not move a paused job's device memory to host memory: it holds its VRAM.",
        "Check the driver's checkpoint support (`arbiter doctor`).",
    ),
    Code(
        CERT_NOT_ISSUED,
        "problem",
        "A paired run passed, but what its certificate would be bound to cannot be read.",
        "Make the protected program's executable readable by the daemon, and run again.",
    ),
    Code(
        FLEET_CERT_NOT_PUBLISHED,
        "problem",
        "A certificate earned here could not be written to the fleet's shared folder.",
        "Make fleet_certificates.folder writable by the daemon's account; the next certificate earned is published.",
    ),
    Code(
        FLEET_CERT_REFUSED,
        "problem",
        "A twin's certificate was not adopted: the confirmation run here disagreed with it, or did not confirm it.",
        "The program is slowed differently on this node: earn its own with `arbiter ab sweep --rule RULE`.",
    ),
    Code(
        FLEET_CERT_CORRUPT,
        "problem",
        "A file in the fleet's certificate folder does not parse, is cut short, or fails its signature.",
        "Have the node that earned it publish it again (or remove the file); nothing from it is adopted.",
    ),
    Code(
        FLEET_CERT_UNTRUSTED,
        "problem",
        "A file in the fleet's certificate folder names a node whose key is not listed.",
        "List that node's public key under fleet_certificates.trusted_keys if you trust it "
        "(`arbiter certificates` there prints it).",
    ),
    Code(
        FLEET_CERT_REPLAYED,
        "problem",
        "A file in the fleet's certificate folder is a copy of another node's, or an older copy put back.",
        "Remove the copy; only the file each node published under its own name, newest, is read.",
    ),
    # --- timeline entries ---
    Code(PROTECTION_PHASE_OFF, "event", "A protection phase ended."),
    Code(PROTECTION_GPU_ON, "event", "A protected program started using the GPU."),
    Code(PROTECTION_GPU_OFF, "event", "A protected program stopped using the GPU."),
    Code(JOB_ADMITTED, "event", "A job was admitted."),
    Code(JOB_PAUSED, "event", "A job was paused."),
    Code(JOB_RESUMED, "event", "A job was resumed."),
    Code(JOB_EXITED, "event", "A job's command exited."),
    Code(JOB_ADOPTED, "event", "A job an outside scheduler started was taken on as it runs."),
    Code(GPU_DUTY_START, "event", "A governor started a rule's budget at its certified duty."),
    Code(GPU_DUTY_GROW, "event", "A governor raised the budget."),
    Code(VRAM_RELEASE_REQUESTED, "event", "A tenant was asked to release VRAM."),
    Code(VRAM_RELEASED, "event", "A tenant released VRAM."),
    Code(VRAM_REACQUIRE_REQUESTED, "event", "A tenant released for a handoff was asked to take it back."),
    Code(VRAM_REACQUIRED, "event", "A tenant took its VRAM back."),
    Code(VRAM_HANDOFF_PLANNED, "event", "A plan covers a starved tenant's shortfall."),
    Code(PROFILE_APPLIED, "event", "A tenant's GPU profile was applied while it works on the GPU."),
    Code(PROFILE_RESTORED, "event", "A tenant's GPU profile was undone."),
    Code(GPU_MEMORY_CHECKPOINTED, "event", "A pause moved a job's device memory to host memory: its VRAM is free."),
    Code(GPU_MEMORY_RESTORED, "event", "A resume put a job's device memory back on the GPU."),
    Code(AB_BLOCK_DONE, "event", "A paired run finished a block."),
    Code(AB_BLOCK_EXCLUDED, "event", "A paired run left a block out, and why."),
    Code(AB_RUN_STARTED, "event", "A paired run started (or resumed after a restart)."),
    Code(AB_RUN_SIZED, "event", "A paired run's pilot raised the blocks it needs."),
    Code(
        AB_RUN_EXTENDED,
        "event",
        "A paired run was inconclusive where it was planned to end, with R above 1 − margin: it runs on to the "
        "blocks its hours leave and is judged again there.",
    ),
    Code(AB_RUN_DONE, "event", "A paired run ended: its verdict, or why it was refused or aborted."),
    Code(
        AB_EFFECT_CHANGED,
        "event",
        "A paired run's interval would certify, but the effect changed during the run (it shifted, trended or "
        "wandered, or over the run's first or last quarter it was shown below 1 − margin): the certificate is "
        "withheld, since R is the mean of an effect that moved.",
        "Run it again once the program is in a steady state (after its warm-up, with its cache filled), or with "
        "a shorter `--max-hours`; `arbiter ab show RUN` shows the blocks.",
    ),
    Code(
        AB_ENDS_NOT_SHOWN,
        "event",
        "A paired run's interval would certify, but the effect over the run's first or last quarter of blocks (12 "
        "at most) is not shown within the margin: a certificate vouches for the effect throughout the run, and an "
        "effect that wanders slowly moves the run's mean away from where it began.  The run ends inconclusive.",
        "Run it again once the program is in a steady state.  Where its effect drifts from block to block, a longer "
        "`--window` does not show the ends (each spans the same hours, over which the drift does not average out), "
        "nor does a `--max-hours` past 48 blocks (the ends stop growing there); a larger `--margin` does.  "
        "`arbiter ab show RUN` shows both ends.",
    ),
    Code(AB_SWEEP_DONE, "event", "A sweep of paired runs ended."),
    Code(CERT_ISSUED, "event", "A certificate was issued."),
    Code(
        CERT_SUPERSEDED,
        "event",
        "A later run showed a slowdown at that duty or below: the certificate no longer holds.",
    ),
    Code(FLEET_CERT_PUBLISHED, "event", "A certificate earned here was published to the fleet's shared folder."),
    Code(FLEET_CERT_CONFIRMING, "event", "A confirmation run of a twin's certificate started here."),
    Code(FLEET_CERT_ADOPTED, "event", "A twin's certificate was confirmed here and adopted."),
    Code(
        FLEET_CERT_MISMATCH,
        "event",
        "A twin's certificate was not taken up: its fingerprint (rule, CPU, GPUs, GPU driver, OS, arbiter, program) differs here.",
    ),
    Code(CONFIG_RELOADED, "event", "A rule file was loaded."),
    Code(DAEMON_STARTED, "event", "The daemon started."),
    Code(DAEMON_STOPPED, "event", "The daemon stopped; paused work was resumed."),
)


def catalogue() -> dict[str, Code]:
    """The catalogue by code."""
    return {c.name: c for c in CATALOGUE}
