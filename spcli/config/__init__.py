"""Run configuration: frozen dataclasses validated on construction (run.py: the run; scoring.py: what the speculator
scores and which tokens selection keeps). The Typer layer maps flags one-to-one onto their fields."""
