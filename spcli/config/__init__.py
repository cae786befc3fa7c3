"""Run configuration: frozen dataclasses validated on construction (run.py: the run; scoring.py: what the speculator
scores and which tokens selection keeps; sampling.py: the sampling settings, as vLLM's SamplingParams names them,
that flags and records set). The Typer layer maps flags one-to-one onto their fields."""
