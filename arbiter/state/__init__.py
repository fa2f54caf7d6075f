"""What the state directory records: the SQLite database, the paused journal and the job
records (:mod:`.store`), and the certificates paired runs earn (:mod:`.certificates`)."""
