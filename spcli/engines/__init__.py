"""The base pass: the kept tokens prefilled at their original positions, then decoding, on one of two engines.

  hf/            transformers in this process: the reference engine and the embedded default
  vllm/driver/   vLLM, the side in spcli's process (no GPU touched here before vLLM starts)
  vllm/worker/   vLLM, the side inside vLLM's worker processes (kept positions, the speculator replica)
  stop_strings.py  a row's stop strings, ended and cut alike on both engines

Both take the stages' PrunedRequests (spcli/stages/request.py) and return Generations; building rows, paths and
exit codes is the job's (spcli/job/).
"""
