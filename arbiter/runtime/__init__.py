"""What the plugin API runs on: child processes started safely (:mod:`.children`) and the
work a plugin hands to one (:mod:`.childwork`), bounded HTTP reads (:mod:`.httpread`) and
secret references in rule files (:mod:`.secretref`).  It imports nothing of arbiter's but
the pure engine: :mod:`arbiter.plugin` is built on it."""
