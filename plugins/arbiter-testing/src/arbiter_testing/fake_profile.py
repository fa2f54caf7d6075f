"""``fake_profile``: a GPU profile translator whose "device" is a JSON file the test reads, so
the daemon's profile path (saved before applying, restored at stop and after a crash) runs
where no GPU can be set."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from arbiter.plugin import ActionResult, KindOptions, PluginContext, PluginError, Translator


class FakeProfileOptions(KindOptions):
    kind: str = "fake_profile"
    device_file: str  # {"power_limit_w": N}: the settings a profile changes
    power_limit_w: int


class FakeProfileTranslator(Translator):
    Options = FakeProfileOptions
    actions = frozenset({"profile"})

    def __init__(self, options: FakeProfileOptions, context: PluginContext) -> None:
        super().__init__(options, context)
        self._path = Path(options.device_file)
        self._limit = options.power_limit_w

    def _write(self, settings: dict[str, Any]) -> None:
        tmp = self._path.with_name(f".{self._path.name}.tmp")
        tmp.write_text(json.dumps(settings))
        os.replace(tmp, self._path)

    def read_profile(self, tenant: str) -> dict[str, Any]:
        try:
            return dict(json.loads(self._path.read_text()))
        except (OSError, ValueError) as exc:
            raise PluginError(f"cannot read the fake device {self._path}: {exc}") from None

    def apply_profile(self, tenant: str) -> ActionResult:
        self._write({**self.read_profile(tenant), "power_limit_w": self._limit})
        return ActionResult(requested=(f"power limit {self._limit} W for {tenant}",))

    def restore_profile(self, tenant: str, saved: dict[str, Any]) -> ActionResult:
        self._write(dict(saved))
        return ActionResult(requested=(f"settings {saved} back",))
