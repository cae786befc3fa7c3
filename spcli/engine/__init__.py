"""The path a record takes through an engine, module by module (spcli/run.py and spcli/batch.py drive it).

Resolved once before any of it (spcli/resolved.py): model and speculator folders, dtype, device, scoring.

Shared by both engines, in the order a record meets them:
  load.py        the base's files and weights, the speculator (ModelStack, made complete once)
  request.py     the contract between the stages: a PrunedRequest in, a Generation out
  prepare.py     the per-record stages, wired: tokenize -> speculate -> select
  tokenize.py    a record's prompt or messages -> token ids (units.py: the spans selection keeps whole)
  align.py       a speculator of another tokenizer: its importance carried to the base's tokens
  batching.py    prompts of unequal length in one padded speculator batch
  speculate.py   the speculator pass: importance per prompt token (capture.py: queries and keys after RoPE;
                 the scoring maths: spcli/kernels/)
  pays.py        whether pruning a prompt pays (speculator + kept against full, in FLOPs)
  select.py      kept indices (sorted, original positions)
  failures.py    out of memory (retry a row alone) against a device error (stop)

The hf engine (this process): hf.py (the engine), hf_pass.py (the base pass on transformers).

The vllm engine, driver side (no GPU touched here before vLLM starts): vllm_engine.py (the engine),
vllm_args.py (vLLM's arguments), vllm_refusals.py (what cannot run, refused before vLLM starts),
vllm_pass.py (the base pass: one batch), vllm_stream.py (the base pass as a stream, for spcli/job_loop.py).

The vllm engine, worker side (inside vLLM's processes): vllm_worker.py (kept tokens at their original positions),
pinned_upload.py (its position uploads), replica.py and replica_queue.py (the speculator replica on each rank);
vllm_keys.py holds the names both sides share, without importing vLLM.
"""
