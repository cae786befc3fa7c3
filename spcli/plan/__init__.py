"""The plan for a vLLM run, computed from the models' configs (no weights loaded): per-GPU memory
(memory.py), the speed-up's FLOP limit (flops.py), both put together for `spcli plan` (plan.py, report.py)."""
