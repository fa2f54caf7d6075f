"""Configuration: models (:mod:`.models`), loading with positions (:mod:`.loader`)."""
