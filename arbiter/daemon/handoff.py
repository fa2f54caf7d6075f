"""Carrying out what the decision asks of tenants: VRAM releases, the way back after one
(a reacquire), and GPU profiles.

Both talk to other programs or drivers and may take seconds, so they run on worker threads,
never on the decision thread.  A release's failure is reported back to the decision thread
(the tenant is not asked again at once); its success is confirmed by the decision itself,
from the readers' VRAM.  A profile's previous settings are committed to SQLite before the
profile is applied, so a daemon killed with ``kill -9`` restores them when it starts again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from arbiter.config.loader import validate_kind_options
from arbiter.config.models import KindBlock
from arbiter.daemon.sources import checked
from arbiter.engine import codes
from arbiter.engine.handoff import gb
from arbiter.engine.reacquire import REACQUIRE
from arbiter.engine.types import Release
from arbiter.plugin import Translator
from arbiter.pluginmanager import PluginFailed

if TYPE_CHECKING:
    from arbiter.config.models import NodeConfig
    from arbiter.daemon.recorder import Recorder
    from arbiter.daemon.rules import RuleBook
    from arbiter.pluginmanager import PluginHost
    from arbiter.state.store import Store

log = logging.getLogger("arbiter.handoff")
WORKERS = 4
GRACE_S = 5.0  # beyond a release's own timeout_s, for the plugin call itself
FRESH_MODELS_S = 1.0  # how long a release with nothing to send waits for its probe to read again
#: before a release its rule says a busy server cannot take (release_when_busy: wait or skip),
#: how long a busy probe that dates its readings, and has no timeout_s of its own, is given to
#: read again, and how long one that does not date them is watched for a busy state
FRESH_READ_S = 5.0
FRESH_BUSY_S = 0.5


class TenantActions:
    def __init__(
        self,
        config: NodeConfig,
        host: PluginHost,
        store: Store,
        rulebook: RuleBook,
        recorder: Recorder,
        release_over: Callable[[Release, bool], None],
    ) -> None:
        self.config, self.host, self.store, self.rulebook = config, host, store, rulebook
        self.record = recorder.event
        #: no VRAM is coming back from a release (told to the decision thread)
        self.release_over = release_over
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="tenant")
        # one thread, in order: a restore and an apply asked together must not overtake each other
        self._profiles = ThreadPoolExecutor(max_workers=1, thread_name_prefix="profiles")
        self._lock = threading.Lock()
        self.applied: set[str] = set()  # rules whose profile is applied now
        self.release_failed: dict[str, dict[str, Any]] = {}  # rule → its last release's failure, as a reason

    def submit(self, fn: Any) -> None:
        """Other slow work of the decision's (hashing an executable for a certificate)."""
        self._pool.submit(fn)

    # --- releases -------------------------------------------------------------------------

    def release(self, rel: Release, models: tuple[str, ...]) -> None:
        """Called on the decision thread: hand the request to a worker and return."""
        self._pool.submit(self._release, rel, models)

    def _release(self, rel: Release, models: tuple[str, ...]) -> None:
        if rel.why == REACQUIRE:
            self._reacquire(rel, models)
            return
        held, timeout_s = rel.held_bytes, rel.timeout_s
        live = self.rulebook.live.get(rel.rule_id)
        translator = live.release if live is not None else None
        errors: list[str] = []
        if live is not None and live.rule.release_when_busy != "release" and self._busy_now(live):
            # the plan read it idle, but that reading may be a poll old: a request that came
            # since would make this release break it, so it is planned again on what it says now
            self.record(
                codes.VRAM_RELEASE_DRAINING,
                rel.rule_id,
                f"the release of {rel.rule_id!r} ({rel.why}) was not sent: a reading of its probe begun just now says "
                "it is busy (or did not come in time), and a busy release would break it; it is released once it "
                "reads idle",
                {"tenant": rel.rule_id, "why": rel.why, "held_bytes": rel.held_bytes},
            )
            self.release_over(rel, False)
            return
        if translator is None:
            errors.append("its release translator could not be loaded (see `arbiter doctor`)")
        else:
            assert live is not None
            kind = live.rule.release.kind if live.rule.release else "?"
            try:
                result = self.host.call(
                    f"translators/{kind} release", translator.release, rel.rule_id, models, timeout=timeout_s + GRACE_S
                )
                if not result.errors and not result.requested and rel.why != "idle":
                    # nothing to ask, as its probe last read (no model loaded), though it holds
                    # VRAM: read the probe again now and ask once more with what it says (not for
                    # an idle release: a probe that now lists models says it is not idle)
                    fresh = self._fresh_models(live, models)
                    if fresh:
                        result = self.host.call(
                            f"translators/{kind} release",
                            translator.release,
                            rel.rule_id,
                            fresh,
                            timeout=timeout_s + GRACE_S,
                        )
                errors.extend(result.errors)
                if not result.errors and not result.requested:
                    log.info("release of %s sent nothing: %s", rel.rule_id, result.note)
                    self.release_over(rel, False)  # no VRAM comes back from this request
            except PluginFailed as exc:
                errors.append(exc.why)
        if errors:
            message = f"asking {rel.rule_id!r} to release its {gb(held)} ({rel.why}) failed: {'; '.join(errors)}"
            remedy = (
                f"check that {rel.rule_id!r} runs and answers its release: request (its own log says why it "
                f"refused); raise the release's timeout_s if it is only slow; it is asked again after "
                f"{timeout_s:g}s, and work waiting for that memory waits until then"
            )
            evidence = {"tenant": rel.rule_id, "held_bytes": held, "why": rel.why, "errors": errors}
            self._failed(rel, codes.VRAM_RELEASE_FAILED, message, remedy, evidence)
        else:
            with self._lock:
                self.release_failed.pop(rel.rule_id, None)

    def _failed(self, rel: Release, code: str, message: str, remedy: str, evidence: dict[str, Any]) -> None:
        """A release or reacquire that failed: shown as the tenant's fault until one succeeds,
        recorded, and handed back to the decision thread, which backs off."""
        with self._lock:
            self.release_failed[rel.rule_id] = {
                "code": code,
                "message": message,
                "remedy": remedy,
                "evidence": evidence,
            }
        self.record(code, rel.rule_id, message, {**evidence, "remedy": remedy})
        self.release_over(rel, True)

    def _reacquire(self, rel: Release, models: tuple[str, ...]) -> None:
        """Call the rule's reacquire translator.  A failure goes back to the decision thread
        as a failed request (it backs off); success is confirmed by the decision from the
        readers' VRAM, or, where the reacquire says ``confirm: false``, recorded here."""
        live = self.rulebook.live.get(rel.rule_id)
        block = live.rule.reacquire if live is not None else None
        translator = live.reacquire if live is not None else None
        errors: list[str] = []
        note = ""
        started = time.monotonic()
        if translator is None or block is None:
            errors.append("its reacquire translator could not be loaded (see `arbiter doctor`)")
        else:
            try:
                result = self.host.call(
                    f"translators/{block.kind} reacquire",
                    translator.reacquire,
                    rel.rule_id,
                    models,
                    timeout=rel.timeout_s + GRACE_S,
                )
                errors.extend(result.errors)
                if not result.errors and not result.requested:
                    errors.append(f"it sent nothing ({result.note or 'no request to send'})")
                note = ", ".join(result.requested)
            except PluginFailed as exc:
                errors.append(exc.why)
        if errors:
            message = (
                f"asking {rel.rule_id!r} to take back the {gb(rel.held_bytes)} it released failed: {'; '.join(errors)}"
            )
            remedy = (
                f"check that {rel.rule_id!r} runs and answers its reacquire: request (its own log says why it refused); "
                "it is tried again after a backoff (5 s, doubling to 5 minutes), and answers errors until then "
                "if it needs to be woken"
            )
            evidence = {"tenant": rel.rule_id, "asleep_bytes": rel.held_bytes, "errors": errors}
            # the decision backs off (the request's why says it was a wake)
            self._failed(rel, codes.VRAM_REACQUIRE_FAILED, message, remedy, evidence)
            return
        with self._lock:
            self.release_failed.pop(rel.rule_id, None)
        assert block is not None
        if not block.options().get("confirm", True):
            took = time.monotonic() - started
            self.record(
                codes.VRAM_REACQUIRED,
                rel.rule_id,
                f"{rel.rule_id!r} was asked to take its VRAM back ({note}) and answered in {took:.2f}s",
                {"tenant": rel.rule_id, "duration_s": round(took, 3), "confirmed": False},
            )

    def _busy_now(self, live: Any) -> bool:
        """Whether a reading of the busy probe begun now says busy (or cannot be read).  A
        probe that says when its readings began (``read_at``) is asked to read again and waited
        for until a reading begun after the ask comes: a read that was under way while the
        tenant got work would say idle.  That takes at most two reads (the one under way, then
        the one asked for), so twice the probe's own ``timeout_s`` where its options have one,
        else FRESH_READ_S; one that does not come by then counts as unknown, so busy.  A probe
        that does not date its readings is given FRESH_BUSY_S to say busy."""
        probe = live.busy
        if probe is None or live.rule.busy is None:
            return False
        label = f"sources/{live.rule.busy.kind}"
        asked = time.monotonic()
        try:
            dated = checked(self.host.call(label, probe.state, timeout=1)).read_at > 0
            live.wake_busy(self.host)
            timeout_s = getattr(getattr(probe, "options", None), "timeout_s", None)
            # and half a second for the probe's thread to get a core
            read_s = 2 * timeout_s + 0.5 if isinstance(timeout_s, (int, float)) else FRESH_READ_S
            deadline = asked + (read_s if dated else FRESH_BUSY_S)
            while True:
                now = checked(self.host.call(label, probe.state, timeout=1))
                if now.busy is not False:
                    return True
                if dated and now.read_at >= asked:
                    return False
                if time.monotonic() >= deadline:
                    return dated  # a dated probe that did not read again in time: unknown
                time.sleep(0.005)
        except PluginFailed:
            return True

    def _fresh_models(self, live: Any, stale: tuple[str, ...]) -> tuple[str, ...]:
        """Wake the tenant's busy probe and wait (briefly) for model names it did not have."""
        probe = live.busy
        if probe is None or live.rule.busy is None:
            return ()
        label = f"sources/{live.rule.busy.kind}"
        deadline = time.monotonic() + FRESH_MODELS_S
        live.wake_busy(self.host)
        try:
            while time.monotonic() < deadline:
                models = tuple(self.host.call(label, probe.state, timeout=1).models)
                if models and models != stale:
                    return models
                time.sleep(0.01)
        except PluginFailed:
            pass
        return ()

    # --- profiles ---------------------------------------------------------------------------

    def profiles(self, on: tuple[str, ...], off: tuple[str, ...]) -> None:
        for rid in off:  # restores first: they put back what the next apply will save
            self._profiles.submit(self._guarded, self._restore_rule, rid)
        for rid in on:
            self._profiles.submit(self._guarded, self._apply, rid)

    def _guarded(self, fn: Any, rid: str) -> None:
        try:
            fn(rid)
        except Exception as exc:  # a worker's failure must reach the timeline, not vanish in a future
            log.exception("profile work for %s failed", rid)
            self.record(codes.PLUGIN_FAILED, rid, f"the GPU profile of {rid!r}: {type(exc).__name__}: {exc}")

    def _apply(self, rid: str) -> None:
        live = self.rulebook.live.get(rid)
        if live is None or live.profile is None or live.rule.profile is None:
            return
        block = live.rule.profile
        with self._lock:
            if rid in self.applied:
                return
            try:
                if rid not in self.store.profiles():  # a record not yet restored holds the true originals
                    saved = self.host.call(f"translators/{block.kind} read", live.profile.read_profile, rid)
                    self.store.put_profile(rid, block.kind, block.options(), saved)  # before anything changes
                result = self.host.call(f"translators/{block.kind} apply", live.profile.apply_profile, rid)
            except (PluginFailed, OSError, ValueError) as exc:
                self.record(
                    codes.PLUGIN_FAILED,
                    rid,
                    f"the GPU profile of {rid!r} was not applied: {exc}",
                    {"profile": block.kind},
                )
                return
            if result.requested:
                self.applied.add(rid)
        if result.errors:
            self.record(
                codes.PLUGIN_FAILED,
                rid,
                f"the GPU profile of {rid!r} was {'applied in part' if result.requested else 'not applied'}: "
                f"{'; '.join(result.errors)}",
                {"profile": block.kind, "errors": list(result.errors)},
            )
        if result.requested:
            self.record(
                codes.PROFILE_APPLIED,
                rid,
                f"{rid!r} works on the GPU: its GPU profile is applied",
                {"profile": block.kind, "requested": list(result.requested)},
            )

    def _restore_rule(self, rid: str) -> None:
        row = self.store.profiles().get(rid)
        if row is not None:
            self._restore(rid, row, "it no longer works on the GPU")

    def _restore(self, rid: str, row: dict[str, Any], why: str) -> bool:
        """Put back what ``row`` saved, with a translator made from the stored kind and
        options (the rule may be gone, or changed, since the profile was applied)."""
        with self._lock:
            translator = None
            try:
                translator = self._translator(row["kind"], row["options"], rid)
                if translator is None:
                    raise PluginFailed(f"translators/{row['kind']}", "no installed plugin registers this kind")
                result = self.host.call(
                    f"translators/{row['kind']} restore", translator.restore_profile, rid, row["saved"]
                )
            except (PluginFailed, ValueError) as exc:  # ValueError: stored options no longer valid
                self.record(
                    codes.PLUGIN_FAILED,
                    rid,
                    f"the GPU profile of {rid!r} could not be restored: {exc}; "
                    "it is kept on record and tried again at the next start (put the device's settings back "
                    f"by hand, then delete its row from the profiles table of {self.store.path})",
                    {"profile": row["kind"]},
                )
                return False
            finally:
                if translator is not None:
                    try:
                        translator.close()
                    except Exception:
                        pass
            if result.errors:  # kept on record: restoring is safe to repeat, at the next stop or start
                self.record(
                    codes.PLUGIN_FAILED,
                    rid,
                    f"the GPU profile of {rid!r} was not fully restored ({why}): "
                    f"{'; '.join(result.errors)}; it is tried again at the next start",
                    {"profile": row["kind"], "errors": list(result.errors)},
                )
                return False
            self.store.drop_profile(rid)
            self.applied.discard(rid)
        self.record(
            codes.PROFILE_RESTORED,
            rid,
            f"the GPU settings before {rid!r}'s profile are restored ({why})",
            {"profile": row["kind"]},
        )
        return True

    def _translator(self, kind: str, options: dict[str, Any], rid: str) -> Translator | None:
        info = self.host.kind("translators", kind)
        if info is None:
            return None
        parsed = validate_kind_options(KindBlock(kind=kind, **options), info.cls.Options)
        context = self.host.context(self.config, rule_id=rid)
        return self.host.call(f"translators/{kind}", info.cls, parsed, context)

    def restore_all(self, why: str) -> None:
        """Every profile on record: at start-up (a daemon that died left them) and at stop."""
        for rid, row in self.store.profiles().items():
            self._restore(rid, row, why)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=False)
        self._profiles.shutdown(wait=True, cancel_futures=False)
