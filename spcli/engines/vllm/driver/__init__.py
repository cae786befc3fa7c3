"""The vLLM engine's driver side, in spcli's process (no GPU touched here before vLLM starts).

  engine.py      the engine: vLLM started with spcli's worker extension, a window of records scored and streamed
  args.py        vLLM's arguments from the resolved run
  refusals.py    what cannot run, refused before vLLM starts
  start.py       vLLM's start on a thread of its own (the speculator scores meanwhile on a CPU)
  ready_poll.py  polling the replicas' scored windows
  base_pass.py   the base pass: one batch of requests
  stream.py      the base pass as a stream, for spcli/job/loop.py
"""
