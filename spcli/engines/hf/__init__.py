"""The hf engine: engine.py (the engine an hf run holds), base_pass.py (the base pass on transformers), shared_pass.py
(the base pass of a document group: its kept document prefilled once, each question after a copy of its cache),
sampling.py (a request's penalties, filters and stop strings there, as vLLM's sampler applies them)."""
