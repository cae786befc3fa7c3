"""The vLLM engine's worker side: what runs inside vLLM's worker processes.

  positions.py      the worker extension: kept tokens at their original positions, decoding from the prompt's length
  pinned_upload.py  its position uploads
  replica.py        the speculator replica on each rank (reached through LLM.collective_rpc)
  replica_queue.py  the replica's next window, scored on a thread and stream of its own while vLLM runs
"""
