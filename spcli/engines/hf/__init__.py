"""The hf engine: engine.py (the engine an hf run holds), base_pass.py (the base pass on transformers), sampling.py (a
request's penalties, filters and stop strings there, as vLLM's sampler applies them)."""
