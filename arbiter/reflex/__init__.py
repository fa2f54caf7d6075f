"""The fast path: the reflex process and what acts on jobs.

- :mod:`arbiter.reflex.process` is the process itself (``python -m arbiter.reflex.process``):
  it watches the phase sources of immediate rules and pauses or resumes at once, from the
  table the last decision armed it with;
- :mod:`arbiter.reflex.link` is the daemon's end of its pipe (setup, arms, its report lines);
- :mod:`arbiter.reflex.act` is the :class:`~arbiter.reflex.act.Actuator` both the process
  and the daemon's decision thread act through, and the choice of translators;
- :mod:`arbiter.reflex.limits` caps what a long-running process of arbiter's takes.

Nothing here imports the daemon: the daemon's side (:mod:`arbiter.daemon.linked`) imports it.
"""
