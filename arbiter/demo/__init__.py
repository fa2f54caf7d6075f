"""What ``arbiter demo`` runs, and the tests with it: a protected stand-in program
(``python -m arbiter.demo.protected``), a fleet job that burns a CPU core in place of the GPU
(``python -m arbiter.demo.job``), and :class:`~arbiter.demo.node.LocalNode`, a daemon on a
temporary state directory.  The story the command tells is :mod:`arbiter.cli.story`.
"""
