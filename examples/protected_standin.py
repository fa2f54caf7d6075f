"""A protected stand-in program: CPU work in steps, one JSONL event per step.

    python examples/protected_standin.py --events /tmp/arbiter-example/events.jsonl

Enter a phase by appending a status event to the same file:

    echo '{"event": "status", "state": {"phase": "uploading"}}' >> /tmp/arbiter-example/events.jsonl
"""

from arbiter.demo.protected import main

if __name__ == "__main__":
    main()
