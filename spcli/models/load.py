"""Loading models: the base, its speculator and tokenizer (the ModelStack: `open_stack` for a resolved run,
`load_stack` by name), and `self:K` views."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from spcli.errors import ConfigError, ModelError
from spcli.models import capture, lookup
from spcli.models.device import pick_device
from spcli.models.dtype import resolve_dtype, resolve_speculator_dtype
from spcli.models.files import BaseFiles, read_base, read_config
from spcli.models.speculator import (
    CROSS_TOKENIZER,
    SAME_TOKENIZER,
    SpeculatorTokens,
    check_speculator_attention,
    parse_self,
    speculator_tokens,
)

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class LoadedModel:
    model: nn.Module  # a *ForCausalLM in eval mode, attention "spcli"
    path: Path
    num_layers: int


def load_causal_lm(path: Path, dtype: str, device: torch.device) -> LoadedModel:
    """The checkpoint as a transformers model on `device` (on the CPU, this process's malloc then keeps freed
    memory for the next pass: cpu_memory.py)."""
    from transformers import AutoModelForCausalLM

    impl = capture.register()
    _keep_cpu_memory(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=TORCH_DTYPES[dtype], attn_implementation=impl, local_files_only=True,
            device_map=str(device),  # the weights go straight to their device, not through the CPU
        )
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load model from {path}: {e}") from e
    model.eval()
    return LoadedModel(model, path, model.config.num_hidden_layers)


def _keep_cpu_memory(device: torch.device) -> None:
    if device.type == "cpu":
        from spcli.models.cpu_memory import keep_freed_memory

        keep_freed_memory()


def load_prefix(path: Path, num_layers: int, dtype: str, device: torch.device, total: int | None = None) -> nn.Module:
    """The checkpoint's first `num_layers` decoder layers (with embeddings, final norm and LM head) as a
    transformers model, reading only those tensors: num_layers / L of the layer weights. `total`: the
    speculator's layer count that --score-layers refers to (K of self:K; default all L)."""
    config = read_config(path)
    if getattr(config, "quantization_config", None):
        method = dict(config.quantization_config).get("quant_method", "quantized")
        raise ConfigError(
            f"--speculator self needs the base model's first layers in transformers, but {path} is a {method} "
            "checkpoint whose layers this speculator cannot run; pass a separate speculator of the same "
            "tokenizer (--speculator NAME|FOLDER, e.g. llama-8b)"
        )
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    _keep_cpu_memory(device)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report lists the layers left out on purpose, as unexpected keys
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, num_hidden_layers=num_layers, dtype=TORCH_DTYPES[dtype], attn_implementation=capture.register(),
            local_files_only=True, device_map=str(device),
        )
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the first {num_layers} layers of {path}: {e}") from e
    finally:
        hf_logging.set_verbosity(verbosity)
    model.spcli_num_layers = total or config.num_hidden_layers  # what --score-layers' negatives count from
    return model.eval()


def first_layers(base: nn.Module, num_layers: int) -> nn.Module:
    """A view of `base` (a *ForCausalLM) that runs only its first `num_layers` decoder layers, then its
    final norm and LM head. Shares every parameter tensor with `base` (shallow module copies)."""
    total = base.config.num_hidden_layers
    if num_layers in (0, total):
        return base
    if not 1 <= num_layers <= total:
        raise ConfigError(f"--speculator self:K needs 1 <= K <= {total} (the base model's layers), got {num_layers}")
    view = copy.copy(base)
    view._modules = dict(base._modules)
    view.model = decoder_prefix(base, num_layers, final_norm=True)
    view.config = view.model.config
    return view


def decoder_prefix(causal_lm: nn.Module, num_layers: int, final_norm: bool = False) -> nn.Module:
    """The decoder stack of `causal_lm` cut after its first `num_layers` layers (early exit): no later
    layers, no LM head, and without `final_norm` no final norm either. Shares every parameter tensor."""
    inner = causal_lm.model
    config = copy.copy(inner.config)
    config.num_hidden_layers = num_layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:num_layers]
    view = copy.copy(inner)
    view._modules = dict(inner._modules)
    view.layers = nn.ModuleList(list(inner.layers)[:num_layers])
    if not final_norm:
        view.norm = nn.Identity()
    view.config = config
    return view


@dataclass(frozen=True)
class ModelStack:
    """Everything a run needs from the models: the one loader used by both engines, eval and bench.

    Made complete, once (open_stack): no field changes afterwards. `base` is None where the base runs elsewhere
    (vLLM holds its own weights). The speculator and its tokenizer are read on first use, so a run at keep 1.0
    never loads them; those two caches are the only state set after construction.
    """

    path: Path  # the base model's folder
    name: str  # the base model's name as given
    tokenizer: object
    eos_ids: set[int]
    pad_id: int
    max_positions: int  # the base's max_position_embeddings
    dtype: str
    device: torch.device
    speculator_name: str  # resolved: a model name/folder, "self" or "self:K"
    base: nn.Module | None = None  # a *ForCausalLM in eval mode, attention "spcli"
    speculator_layers: int | None = None  # without base weights: the first layers a self speculator reads
    located: tuple[str, Path] | None = None  # (a separate speculator's name, its folder) as located before the stack
    _speculator: nn.Module | None = None
    _speculator_tokens: SpeculatorTokens | None = None
    _is_tokens_checked: bool = False
    # where the speculator runs elsewhere (vLLM's workers): (prompts, score, on_stage, should_stop) -> one
    # Speculation or RecordError per prompt, as prepare.speculate_prompts returns
    speculate_remote: Callable | None = None

    max_prompt_len: int | None = None  # an engine's own bound on prompt length (vLLM: the speculator reserve's)
    speculator_dtype: str | None = None  # the speculator's where it differs from `dtype` (--speculator-dtype)
    prompt_len_flag: str = ""  # the flag that raises max_prompt_len

    def max_prompt_tokens(self, max_tokens: int) -> int:
        """The longest prompt this stack takes with max_tokens to generate."""
        room = self.max_positions - max_tokens
        return room if self.max_prompt_len is None else min(room, self.max_prompt_len)

    def prompt_limit(self, max_tokens: int):
        """Where max_prompt_tokens comes from, for an error row: the limit and what raises it, as a function of
        the prompt's length n (lowering --max-tokens is suggested only where that makes the prompt fit)."""
        if self.max_prompt_len is not None and self.max_prompt_len < self.max_positions - max_tokens:
            return f"the speculator's memory plan is sized for {self.max_prompt_len}-token prompts; raise {self.prompt_len_flag}"
        limit = f"the model's max_position_embeddings {self.max_positions} minus max_tokens {max_tokens}"
        return lambda n: limit + ("; lower --max-tokens" if n < self.max_positions else
                                  f"; the prompt alone exceeds the model's {self.max_positions} positions")

    @property
    def speculator(self) -> nn.Module:
        if self._speculator is None:
            object.__setattr__(self, "_speculator", self._load_speculator())  # a cache, filled on first use
        return self._speculator

    @property
    def speculator_tokens(self) -> SpeculatorTokens | None:
        """The speculator's own tokenizer where it differs from the base's (read once); None: the same ids."""
        if not self._is_tokens_checked:
            tokens = speculator_tokens(self.tokenizer, self.speculator_name, self.speculator_path)
            object.__setattr__(self, "_speculator_tokens", tokens)  # a cache, filled on first use
            object.__setattr__(self, "_is_tokens_checked", True)
        return self._speculator_tokens

    @property
    def speculator_path(self) -> Path | None:
        """The separate speculator's folder where it was located before the stack (None: located on use); a stack
        copied with another speculator_name (eval's) locates its own."""
        located = self.located
        return located[1] if located is not None and located[0] == self.speculator_name else None

    @property
    def scoring(self) -> str:
        """SAME_TOKENIZER or CROSS_TOKENIZER: which path scores the base's tokens."""
        return SAME_TOKENIZER if self.speculator_tokens is None else CROSS_TOKENIZER

    @property
    def speculator_eos_ids(self) -> set[int]:
        tokens = self.speculator_tokens
        return self.eos_ids if tokens is None else tokens.eos_ids

    @property
    def speculator_dtype_used(self) -> str:
        """The dtype the speculator runs in: --speculator-dtype's, or the base's."""
        return self.speculator_dtype or self.dtype

    def _load_speculator(self) -> nn.Module:
        k = parse_self(self.speculator_name)
        dtype = self.speculator_dtype_used
        if k is not None and self.base is not None and dtype == self.dtype:
            check_speculator_attention(self.path, self.name, self.speculator_name, self.max_positions)
            return first_layers(self.base, k)  # shares the base's weights (in another dtype: its own copy, below)
        layers = self.speculator_layers
        if k is not None and layers is None:  # a stack copied with another self:K (eval's) carries no count of its own
            layers = self_layers_for(self.path, self.speculator_name, None, own_copy=True)
        return speculator_source(self.path, self.name, self.speculator_name, dtype, self.max_positions, layers,
                                 self.speculator_path).load(self.device)


def speculator_source(path: Path, model: str, speculator: str, dtype: str, max_positions: int,
                      speculator_layers: int | None = None, speculator_path: Path | None = None):
    """What a speculator loads where the base's weights are not here (vLLM holds them): a model folder
    (of any tokenizer: prepare aligns), or only the base's first `speculator_layers` layers
    (`self`/`self:K`). Checked here, so a worker replica loads what the driver would."""
    from spcli.models.load import SpeculatorSource

    k = parse_self(speculator)
    check_speculator_attention(path, model, speculator, max_positions, speculator_path)
    if k is not None:
        assert speculator_layers, "give speculator_layers where the base has no weights here"
        return SpeculatorSource(str(path), dtype, speculator_layers, total=k or None)
    return SpeculatorSource(str(speculator_path or lookup.locate(speculator)), dtype)  # any tokenizer (prepare aligns)


UNREAD = object()  # open_stack's speculator_tokens: not read yet (the stack reads them on first use)


def open_stack(base: BaseFiles, model: str, speculator: str, dtype: str, device: torch.device, *,
               with_base: bool = True, needs_speculator: bool = True, speculator_path: Path | None = None,
               speculator_tokens=UNREAD, **engine) -> ModelStack:
    """The stack of a model already located, with its speculator, dtype and device already picked (spcli.models.resolved
    for a run): nothing is located or picked here. Loads the base's weights when `with_base`.
    `needs_speculator`: refuse a sliding-window speculator now, before any weights load (else on first use);
    `speculator_path`: a separate speculator's folder where already located; `speculator_tokens`: what
    load.speculator_tokens gave where already read; `engine`: an engine's own ModelStack fields
    (max_positions, speculator_layers, speculate_remote, max_prompt_len, prompt_len_flag)."""
    if needs_speculator:
        check_speculator_attention(base.path, model, speculator, base.max_positions, speculator_path)
    read = {} if speculator_tokens is UNREAD else {"_speculator_tokens": speculator_tokens, "_is_tokens_checked": True}
    fields = dict(path=base.path, name=model, tokenizer=base.tokenizer, eos_ids=base.eos_ids, pad_id=base.pad_id,
                  max_positions=base.max_positions, dtype=dtype, device=device, speculator_name=speculator,
                  located=None if speculator_path is None else (speculator, speculator_path), **read)
    return ModelStack(**{**fields, **engine},
                      base=load_causal_lm(base.path, dtype, device).model if with_base else None)


def load_stack(model: str, speculator: str | None = None, dtype: str | None = None, device: str = "auto",
               with_base: bool = True, path: Path | None = None, needs_speculator: bool = True,
               speculator_dtype: str | None = None) -> ModelStack:
    """open_stack by name (eval, bench, calibrate): `model` located (`path`: its folder when already located),
    its speculator (default: the model's), dtype, the speculator's dtype and device picked here, as
    spcli.models.resolved does for a run. A self:K speculator in another dtype than the base's is its own copy of the
    base's first K layers, every layer for `self` (eval and calibrate score several layers: ModelStack._load_speculator)."""
    path = path or lookup.locate(model)
    torch_device = pick_device(device)
    resolved_dtype = resolve_dtype(dtype, model, torch_device)[0]
    spec_dtype = resolve_speculator_dtype(speculator_dtype, resolved_dtype, torch_device)[0]
    speculator = speculator or lookup.default_speculator(model)
    return open_stack(read_base(path), model, speculator, resolved_dtype, torch_device, with_base=with_base,
                      needs_speculator=needs_speculator, speculator_dtype=spec_dtype)


def self_layers_for(path: Path, speculator: str, score, own_copy: bool) -> int | None:
    """The base's first layers a self speculator loads as a copy of its own (`own_copy`: in another dtype than the
    base's; None: it is a view of the base's layers, or not a self speculator)."""
    from spcli.models.speculator import self_layers

    if parse_self(speculator) is None or not own_copy:
        return None
    total = read_config(path).num_hidden_layers
    if score is None or not score.is_resolved or score.lookahead:  # look-ahead decodes: every layer, head included
        return parse_self(speculator) or total
    return self_layers(speculator, score, total)


@dataclass(frozen=True)
class SpeculatorSource:
    """Which weights a speculator replica loads: a model folder, or the first `num_layers` layers of
    one (`self`/`self:K` with early exit; `total` = K, what --score-layers counts from)."""

    path: str
    dtype: str
    num_layers: int | None = None
    total: int | None = None

    def load(self, device: torch.device) -> nn.Module:
        from pathlib import Path

        from spcli.models import load

        if self.num_layers:
            return load.load_prefix(Path(self.path), self.num_layers, self.dtype, device, total=self.total)
        return load.load_causal_lm(Path(self.path), self.dtype, device).model

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
