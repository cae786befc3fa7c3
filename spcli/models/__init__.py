"""The models: names to folders, and folders to loaded weights.

Lookup: presets.py (the names), lookup.py (a name, folder, GGUF file or HF id -> a local folder), folders.py (the
model cache), part_wheels.py (`make models-qwen`), random_pair.py (bench's random-weight pair), profiles.py
(scoring settings per model), dtype.py and device.py (what a model loads in, and where).
Loading: files.py (a folder's tokenizer and config), speculator.py (self:K or another model), positions.py (position
schemes pruning can keep), load.py (the ModelStack both engines run), capture.py (the attention every loaded model
runs, with queries and keys captured for scoring), cpu_memory.py (malloc on the CPU).
"""
