"""Fake programs that hold VRAM, serving on 127.0.0.1 the subsets of their real APIs arbiter
uses: :class:`FakeLlmServer` (a local LLM server, :mod:`arbiter_testing.fake_llm`),
:class:`FakeDiffusionServer` (an image-diffusion server, :mod:`arbiter_testing.fake_diffusion`)
and :class:`RecordingServer` (:mod:`arbiter_testing.fake_http`), which answers every request
with a scripted status and records it.

Every fake writes the VRAM its process holds to a :class:`~arbiter_testing.vram_board.VramBoard`
(the ``fake`` reader's state file).  Run one as its own process (so a daemon can match it by
its command line) with ``python -m arbiter_testing.fake_servers llm|diffusion ...``.
"""

from __future__ import annotations

import argparse

from arbiter_testing.fake_diffusion import FakeDiffusionServer, Run
from arbiter_testing.fake_http import RecordingServer, Seen
from arbiter_testing.fake_llm import FakeLlmServer, FakeModel, Unload
from arbiter_testing.fake_process import board_of, fake_parser, serve_until_stopped
from arbiter_testing.vram_board import GIB

__all__ = ["FakeDiffusionServer", "FakeLlmServer", "FakeModel", "RecordingServer", "Run", "Seen", "Unload", "main"]


def _model(spec: str) -> FakeModel:
    name, sep, gb = spec.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--model takes NAME=GB, not {spec!r}")
    return FakeModel(name, int(float(gb) * GIB))


def main(argv: list[str] | None = None) -> int:
    """Run one fake as this process until SIGTERM; its ports go into ``--ready-file``."""
    parser = fake_parser("arbiter_testing.fake_servers", "{pid, url, ws_url}")
    parser.add_argument("program", choices=["llm", "diffusion"])
    parser.add_argument("--model", type=_model, action="append", default=[], help="llm: NAME=GB it can load")
    parser.add_argument("--load-s", type=float, default=0.0)
    parser.add_argument("--unload-s", type=float, default=0.0)
    parser.add_argument("--gen-s", type=float, default=0.05, help="llm: how long a request with a prompt runs")
    parser.add_argument("--model-gb", type=float, default=6.0, help="diffusion: what it keeps loaded")
    parser.add_argument("--needs-gb", type=float, default=12.0, help="diffusion: what a run needs")
    parser.add_argument("--fast-s", type=float, default=0.3)
    parser.add_argument("--starved-s", type=float, default=3.0)
    parser.add_argument(
        "--release-fault",
        choices=["", "500", "hang"],
        default="",
        help="llm: answer unload requests with HTTP 500, or never",
    )
    args = parser.parse_args(argv)
    board = board_of(args)
    if args.program == "llm":
        llm = FakeLlmServer(
            board,
            args.model or [FakeModel("mistral:latest", 13 * GIB)],
            load_s=args.load_s,
            unload_s=args.unload_s,
            generate_s=args.gen_s,
        )
        llm.release_fault = args.release_fault
        return serve_until_stopped(llm, args.ready_file)
    diffusion = FakeDiffusionServer(
        board, int(args.model_gb * GIB), int(args.needs_gb * GIB), args.fast_s, args.starved_s, unload_s=args.unload_s
    )
    return serve_until_stopped(diffusion, args.ready_file, ws_url=diffusion.ws_url)


if __name__ == "__main__":
    raise SystemExit(main())
