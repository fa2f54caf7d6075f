"""Every operation of the published OpenAPI schema, fuzzed against a real daemon's listener:
no input, valid or not, makes it answer with a server error."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.generation import GenerationMode

from arbiter.daemon.core import Daemon

from .conftest import StartDaemon

EXAMPLES = 12  # per operation and mode: bounded, so the whole walk stays well under a minute


def test_no_operation_answers_a_server_error(start_daemon: StartDaemon) -> None:
    daemon: Daemon = start_daemon()
    assert daemon.http_url.startswith("http://127.0.0.1:")
    schema = schemathesis.openapi.from_url(daemon.http_url + "/openapi.json")
    headers = {"Authorization": f"Bearer {daemon.token}"}
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results), [result for result in results if not isinstance(result, Ok)]
    labels = {op.label for op in operations}
    assert {"GET /v1/status", "GET /v1/timeline", "POST /v1/reload", "GET /v1/ab/{run_id}"} <= labels, labels
    tried = 0
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=EXAMPLES,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def fuzz(case: schemathesis.Case[Any]) -> None:
                nonlocal tried
                tried += 1
                # with the token, so mutations get past the gate and are exercised too
                case.call_and_validate(
                    base_url=daemon.http_url, headers=headers, checks=[not_a_server_error], timeout=30
                )

            try:
                fuzz()
            except Unsatisfiable:
                # no parameters, or only free strings: the schema admits no invalid input
                assert mode is GenerationMode.NEGATIVE, operation.label
            except Exception as exc:
                raise AssertionError(f"{operation.label} ({mode.value}): {exc}") from exc
    assert tried >= len(operations)
