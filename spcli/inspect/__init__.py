"""`spcli inspect`: what a run kept and dropped, in the terminal and in a self-contained HTML file.

outputs (read a run directory) -> summary (run-level numbers) | tokens (one row re-tokenised,
kept/dropped/forced per token) | compare (two runs joined by id) -> terminal | html.
"""
