"""The stages a record passes through before the base model, shared by both engines, in the order it meets them.

  request.py     the contract between the stages: a PrunedRequest in, a Generation out
  prepare.py     the per-record stages, wired: tokenize -> speculate -> select (what an engine calls)
  tokenize.py    a record's prompt or messages -> token ids (units.py: the spans selection keeps whole)
  restate.py     an instruction asked before the document, read again after it by the speculator
  batching.py    prompts of unequal length in one padded speculator batch
  speculate.py   the speculator pass: importance per prompt token (the scoring maths: spcli/kernels/)
  speculate_shared.py  the same, for prompts sharing a prefix (a document's questions): the prefix read once
  align.py       a speculator of another tokenizer: its importance carried to the base's tokens
  pays.py        whether pruning a prompt pays (speculator + kept against full, in FLOPs: spcli/plan/flops.py)
  select.py      kept indices (sorted, original positions)
  failures.py    out of memory (retry a row alone) against a device error (stop)

The models the stages run (ModelStack, the speculator, capture of queries and keys) are spcli/models/; the base
pass is each engine's own (spcli/engines/).
"""
