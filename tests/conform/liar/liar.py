"""A job that lies: it reports holding its duty at 0.3 while it spins at full speed."""

import json
import os
import time

events = os.environ["ARBITER_EVENTS"]


def emit(**fields: object) -> None:
    with open(events, "a") as fh:
        fh.write(json.dumps({"t": time.time(), **fields}) + "\n")


emit(event="phase", phase="work")
last = time.monotonic()
while True:
    while time.monotonic() - last < 2.0:
        pass  # busy, whatever the control document says
    last = time.monotonic()
    emit(event="metric", name="gpu_duty", busy=0.3, duty=0.3, device="cpu")
