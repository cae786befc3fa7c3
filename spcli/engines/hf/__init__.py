"""The hf engine: engine.py (the engine an hf run holds), base_pass.py (the base pass on transformers), shared_pass.py
(the base pass for groups of requests sharing a kept prefix, prefilled once; not wired into the job yet)."""
