"""The hf engine: engine.py (the engine an hf run holds), base_pass.py (the base pass on transformers)."""
