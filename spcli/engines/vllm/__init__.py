"""The vLLM engine: driver/ runs in spcli's process, worker/ inside vLLM's worker processes; keys.py holds the names
both sides share, without importing vLLM."""
