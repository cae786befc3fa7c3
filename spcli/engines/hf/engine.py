"""The `hf` engine: transformers + torch, the reference engine and the embedded default.

`generate(requests)` runs the base pass (hf_pass.py) on PrunedRequests from `prepare`. A batch that
runs out of memory (GPU or CPU) is freed and retried one row at a time; a row that still fails becomes
its RecordError. A device error that is not out of memory (CUDA error, NCCL) raises EngineDied.
"""

from __future__ import annotations

from spcli.config.run import RunConfig
from spcli.engines.hf import base_pass as hf_pass
from spcli.engines.hf import shared_pass
from spcli.engines.hf.shared_pass import SharedGroup
from spcli.errors import RecordError
from spcli.models import files, load
from spcli.models.device import free_memory
from spcli.models.resolved import ResolvedRun, resolve_run
from spcli.stages.failures import is_out_of_memory, raise_if_device_error
from spcli.stages.request import Generation, PrunedRequest


class HFEngine:
    def __init__(self, run: ResolvedRun | RunConfig, log=lambda msg: None, with_base: bool = True):
        """`run`: the resolved run (spcli.models.resolved); a RunConfig is resolved here (tests, benches).
        with_base=False: the speculator alone (a prepare stage whose base pass runs elsewhere: spcli.ray.processor);
        `generate` is then refused."""
        run = run if isinstance(run, ResolvedRun) else resolve_run(run)
        self.cfg = run.cfg
        self.log = log
        # without the base's weights, or in another dtype than the base's, a self speculator reads its first layers
        # from the checkpoint (else it is a view of the base's)
        own_copy = not with_base or run.speculator_dtype != run.dtype
        layers = load.self_layers_for(run.model_path, run.speculator, run.cfg.score, own_copy) if run.prunes else None
        self.stack = load.open_stack(files.read_base(run.model_path), run.cfg.model, run.speculator, run.dtype,
                                     run.device, needs_speculator=run.prunes, speculator_path=run.speculator_path,
                                     with_base=with_base, speculator_layers=layers, speculator_dtype=run.speculator_dtype)

    def check(self, req: PrunedRequest) -> None:
        """Engine-specific refusals of a prepared request (raise RecordError): none here; prompts longer
        than max positions minus max_tokens are refused by tokenize."""

    def generate(self, requests: list[PrunedRequest], should_stop=lambda: False) -> list[Generation | RecordError]:
        """should_stop() is asked between decode steps (StopAtSafePoint drops the batch)."""
        s = self.stack
        if s.base is None:
            raise RuntimeError("this HFEngine was opened without its base model (with_base=False): it only prepares")
        try:
            return self._generate(requests, should_stop)
        except (RuntimeError, MemoryError) as e:
            raise_if_device_error(e, "hf")
            message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            is_oom = is_out_of_memory(e)
        # out of the except block: the traceback (and the failed batch's cache in its frames) is garbage now
        if is_oom:
            free_memory()
        if len(requests) == 1:
            what = f"out of memory on {requests[0].num_prompt_tokens} prompt tokens ({message})" if is_oom else message
            return [RecordError(f"model failed: {what}")]
        self.log(f"batch of {len(requests)} failed ({message}); retrying one row at a time")
        return [g for r in requests for g in self.generate([r], should_stop)]

    def _generate(self, requests: list[PrunedRequest], should_stop) -> list[Generation]:
        """Members of a document group (spcli.stages.share) through shared_pass, their kept document prefilled once;
        the others through hf_pass."""
        s = self.stack
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            if r.group is not None and r.shared_kept > 0 and r.num_prompt_tokens > r.shared_len:
                groups.setdefault(r.group, []).append(i)
        shared = [members for members in groups.values() if len(members) > 1]
        alone = sorted(set(range(len(requests))) - {i for members in shared for i in members})
        out: list[Generation | None] = [None] * len(requests)
        if alone:
            gens = hf_pass.generate(s.base, [requests[i] for i in alone], s.tokenizer, s.eos_ids, s.pad_id, s.device,
                                    should_stop=should_stop)
            for i, gen in zip(alone, gens):
                out[i] = gen
        if shared:
            groups_in = [SharedGroup([requests[i] for i in members], requests[members[0]].kept[: requests[members[0]].shared_kept])
                         for members in shared]
            for members, gens in zip(shared, shared_pass.generate_shared(s.base, groups_in, s.tokenizer, s.eos_ids,
                                                                         s.pad_id, s.device, should_stop=should_stop)):
                for i, gen in zip(members, gens):
                    out[i] = gen
        return out  # type: ignore[return-value]

    def close(self) -> None:
        pass
