"""The job's wiring: a run from its resolved configuration to committed parts.

  resolved.py   the run resolved once, before anything loads (models, dtype, device, scoring)
  run.py        `spcli run` on this process's shards: resume, commits, signals (manifest.py, shares.py, summary.py)
  batch.py      one batch of records through an engine, into output rows
  loop.py       the streaming loop of the vLLM engine (records in flight, reordered before commit)
  retry.py      --retry-failed: the error rows redone
  stop.py       a signal turned into a stop at the next safe point
  progress.py   progress lines and bars; banner.py, the run's opening lines
"""
