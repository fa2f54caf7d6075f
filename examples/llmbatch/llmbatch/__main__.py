"""``python -m llmbatch run|doctor``.

``run`` reads prompts (one per line), and for each: prefill in chunks that ``duty.scale()``
sizes, then ``--steps`` generation steps, each one unit; it prints one JSON line per prompt.
Under arbiter (``ARBITER_CONTROL`` set) it holds the duty of its control document, pauses
and stops at a unit's end; outside arbiter it runs at duty 1.  ``ARBITER_PAYLOAD`` (JSON, as
the conformance kit sets it) overrides the options of the same names.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from arbiter.sdk import Control, Duty, Stopped
from llmbatch.backends import doctor, load

HERE = Path(__file__).resolve().parent.parent


def _options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="llmbatch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the prompts")
    run.add_argument("--backend", default="stand-in", choices=["stand-in", "llama.cpp", "mlx", "auto"])
    run.add_argument("--models", type=Path, default=HERE / "models")
    run.add_argument("--prompts", type=Path, default=HERE / "prompts.txt")
    run.add_argument("--steps", type=int, default=24, help="tokens generated per prompt")
    run.add_argument("--width", type=int, default=64, help="stand-in work per step (≈ width² multiply-adds)")
    run.add_argument("--prefill-chunk", type=int, default=16, help="prefill positions per unit at full scale")
    run.add_argument("--repeat", type=int, default=1, help="passes over the prompts; 0: until stopped")
    run.add_argument("--memory-limit-gb", type=float, default=None, help="a memory limit (never a wired one)")
    run.add_argument("--out", type=Path, default=None, help="write results here instead of stdout")
    doc = sub.add_parser("doctor", help="say which backends can load here")
    doc.add_argument("--models", type=Path, default=HERE / "models")
    args = parser.parse_args(argv)
    payload = os.environ.get("ARBITER_PAYLOAD")
    if payload and args.command == "run":
        for key, value in json.loads(payload).items():
            setattr(args, key.replace("-", "_"), value)
    return args


def run(args: argparse.Namespace) -> int:
    limit = int(args.memory_limit_gb * (1 << 30)) if args.memory_limit_gb else None
    model = load(args.backend, Path(args.models), int(args.width), limit)
    prompts = [line.rstrip("\n") for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    ctl = Control()
    duty = Duty(ctl, device=model.device)
    out = open(args.out, "w") if args.out else sys.stdout  # noqa: SIM115 - closed below
    generated = 0
    started = time.monotonic()
    passes = 0
    try:
        while args.repeat == 0 or passes < args.repeat:
            for n, prompt in enumerate(prompts):
                model.reset()
                tokens = model.tokenize(prompt)
                ctl.phase("prefill")
                i, chunk = 0, int(args.prefill_chunk)
                while i < len(tokens):
                    with duty.unit():
                        for token in tokens[i : i + chunk]:
                            model.feed(token)
                    i += chunk
                    # the next chunk sized from this one, to fit the duty's share of a second
                    chunk = max(1, min(int(args.prefill_chunk), int(chunk * duty.scale())))
                ctl.phase("generate")
                text: list[int] = []
                for _ in range(int(args.steps)):
                    with duty.unit():
                        text.append(model.next_token())
                generated += len(text)
                out.write(json.dumps({"prompt": n, "text": model.detokenize(text)}) + "\n")
                out.flush()
            passes += 1
    except Stopped:
        duty.close()
        print(f"llmbatch: stopped by arbiter after {generated} tokens", file=sys.stderr)
        return ctl.acknowledge_stop()
    finally:
        if out is not sys.stdout:
            out.close()
    duty.close()
    working = time.monotonic() - started - duty.idle_s
    rate = generated / working if working > 0 else 0.0
    print(
        f"llmbatch: {generated} tokens on {model.name}, {rate:.1f} tokens/s while working "
        f"(idle for the duty {duty.idle_s:.1f}s)",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _options(argv)
    if args.command == "doctor":
        for a in doctor(Path(args.models)):
            print(f"{a.backend:10} {'loads' if a.loads else 'cannot load'}: {a.why}")
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
