"""llmbatch: the reference arbiter job.  Batches of prompts through a language model, each
generation step one unit of GPU work held to its duty, prefill in chunks sized to fit."""
