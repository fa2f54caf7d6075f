"""``arbiter demo``: the whole story on any machine, with a CPU standing in for the GPU."""
