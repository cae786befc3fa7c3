"""The one contract between the stages: a pruned request in, a generation out.

`prepare` (tokenize -> speculate -> select) makes a `PrunedRequest` per record; a base backend
(transformers or vLLM) turns a list of them into one `Generation` each. Bench and eval use the
same two types, so what they measure is what `spcli run` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spcli.config.sampling import DEFAULT, Sampling
from spcli.stages.align import Alignment


@dataclass
class PrunedRequest:
    """One prompt for the base pass: its kept tokens, at their original positions."""

    record_id: str
    token_ids: list[int]  # [n] the whole prompt
    kept: torch.Tensor  # [m] int64, ascending indices into token_ids (all n when not pruned)
    max_tokens: int
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0  # per-row sampling seed: its record's seed, else prepare.row_seed
    sampling: Sampling = DEFAULT  # filters, penalties, stop strings (spcli.config.sampling)
    num_logprobs: int = 0  # top alternatives per generated token; 0 = no logprobs
    keep: float | str = 1.0  # the keep rate asked for this record: a fraction, or "auto"
    speculate_s: float = 0.0  # speculator forward + scoring + selection for this prompt; 0 when not pruned
    importance: torch.Tensor | None = None  # [n] float32, when the speculator ran
    unpooled: torch.Tensor | None = None  # [n] float32, the importance at pool 1, when keep auto asked for it
    speculator_ids: list[int] | None = None  # [n_spec] the prompt in a speculator's own tokenizer (cross-tokenizer)
    alignment: Alignment | None = None  # speculator tokens -> base tokens, with speculator_ids
    units: torch.Tensor | None = None  # [n] int64 selection unit of each token (spcli.stages.units), when pruned
    protected: torch.Tensor | None = None  # [n] bool tokens never dropped (SelectConfig.protect), when there are any
    restated: list[int] | None = None  # the instruction again, in the speculator's tokens, read after the prompt (scoring only)
    group: str | None = None  # the document group it shares its kept prefix with (its first record's id), if any
    group_size: int = 1
    shared_len: int = 0  # the group's shared prompt prefix, in tokens (L): kept[:shared_kept] are the group's
    shared_kept: int = 0  # kept positions inside it, the same for every member (spcli.stages.share)
    sharing: str | None = None  # what its group did with it (spcli.stages.share.SHARING), for the run's end
    leads: bool = False  # its group's first member: counts the group once

    @property
    def speculator_token_ids(self) -> list[int]:
        """What the speculator reads: its own tokens, or the base's where they share the tokenizer."""
        return self.token_ids if self.speculator_ids is None else self.speculator_ids

    @property
    def speculator_prompt(self) -> list[int]:
        """What the speculator prefills: its tokens, then the restated instruction (spcli.stages.restate)."""
        return self.speculator_token_ids + (self.restated or [])

    @property
    def forced(self) -> torch.Tensor | None:
        """[n] bool: base tokens no speculator token covers (cross-tokenizer), kept whatever the budget."""
        return None if self.alignment is None else self.alignment.forced

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_pruned(self) -> bool:
        return int(self.kept.numel()) < len(self.token_ids)

    def kept_ids(self) -> torch.Tensor:
        """[m] int64 token ids of the kept tokens."""
        return torch.tensor(self.token_ids, dtype=torch.long)[self.kept]


@dataclass
class TokenLogprob:
    """A generated token's log-probability and the top alternatives at its step."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # [(token id, logprob)] best first, num_logprobs long


@dataclass
class Generation:
    """What the base pass made of one request."""

    token_ids: list[int]  # generated tokens, end-of-sequence excluded
    text: str  # token_ids decoded by the base model's tokenizer
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    ttft_s: float  # this row's time from the start of its base pass to its first token
    prefill_s: float  # the base prefill that produced this row's first token
    decode_s: float  # this row's decode steps
    logprobs: list[TokenLogprob] | None = None  # per generated token, when num_logprobs > 0
    first_logprobs: torch.Tensor | None = None  # [V] float32 log-softmax of the first step (hf, eval only)
