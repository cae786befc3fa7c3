"""What a model's memory and FLOPs depend on, without loading weights.

A `ModelShape` comes from a config.json (a local folder's, or the facts shipped in
`spcli.plan.configs` for presets whose weights are not here) and lists every weight tensor: read
from the safetensors headers when the folder has them (exact names, shapes and stored dtypes),
else derived from the config for a Llama-style decoder:

    embed_tokens   [V, h]                       lm_head [V, h] unless tie_word_embeddings
    per layer:     q_proj [H*D, h]  k_proj, v_proj [KVH*D, h]  o_proj [h, H*D]
                   gate_proj, up_proj [I, h]  down_proj [h, I]  2 norms [h]
    final norm     [h]
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from spcli.errors import ConfigError, ModelError

# bytes per element of safetensors' dtype names (and of the torch names configs use)
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                     "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
TORCH_TO_SAFETENSORS = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


@dataclass(frozen=True)
class Tensor:
    name: str
    numel: int
    dtype: str  # safetensors' name: BF16, F8_E4M3, ...

    @property
    def nbytes(self) -> int:
        return self.numel * SAFETENSORS_BYTES[self.dtype]

    @property
    def layer(self) -> int | None:
        m = re.search(r"\.layers\.(\d+)\.", self.name)
        return int(m[1]) if m else None

    @property
    def is_layer_linear(self) -> bool:
        """A decoder layer's projection weight: what FP8 quantizes and tensor parallelism splits."""
        return self.layer is not None and self.name.endswith("_proj.weight")


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int  # the layers this shape holds (a `self:K` prefix holds K)
    hidden_size: int  # h
    num_heads: int  # H
    num_kv_heads: int  # KVH
    head_dim: int  # D
    intermediate_size: int  # I
    vocab_size: int  # V
    tie_word_embeddings: bool
    max_position_embeddings: int
    is_quantized: bool  # config.json declares quantization_config: the checkpoint is stored quantized
    source: str  # where the facts come from: a config.json path, or "shipped config (no weights here)"
    tensors: tuple[Tensor, ...] = field(repr=False, compare=False)

    @property
    def num_params(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def layer_linear_params(self) -> int:
        """Matmul weights of one decoder layer (what costs 2 FLOPs per token per weight):
        h*H*D (q) + 2*h*KVH*D (k, v) + H*D*h (o) + 3*h*I (gate, up, down)."""
        h, d = self.hidden_size, self.head_dim
        return 2 * h * self.num_heads * d + 2 * h * self.num_kv_heads * d + 3 * h * self.intermediate_size

    def first_layers(self, num_layers: int) -> ModelShape:
        """The first num_layers layers plus every tensor outside the layers (embeddings, final norm, LM
        head): what `self:K` loads."""
        if not 1 <= num_layers <= self.num_layers:
            raise ConfigError(f"{self.name} has {self.num_layers} layers; cannot take its first {num_layers}")
        kept = tuple(t for t in self.tensors if t.layer is None or t.layer < num_layers)
        return dataclasses.replace(self, num_layers=num_layers, tensors=kept)

    @classmethod
    def from_config(cls, name: str, config: dict, source: str, tensors: tuple[Tensor, ...] | None = None,
                    dtype: str = "bfloat16") -> ModelShape:
        c = {**config.get("text_config", {}), **config}
        try:
            heads = int(c["num_attention_heads"])
            shape = cls(
                name=name, num_layers=int(c["num_hidden_layers"]), hidden_size=int(c["hidden_size"]),
                num_heads=heads, num_kv_heads=int(c.get("num_key_value_heads") or heads),
                head_dim=int(c.get("head_dim") or c["hidden_size"] // heads),
                intermediate_size=int(c["intermediate_size"]), vocab_size=int(c["vocab_size"]),
                tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
                max_position_embeddings=int(c.get("max_position_embeddings", 1 << 17)),
                is_quantized="quantization_config" in c, source=source, tensors=(),
            )
        except KeyError as e:
            raise ModelError(f"{source}: config.json has no {e.args[0]!r}, so the plan cannot size {name}") from None
        return dataclasses.replace(shape, tensors=tensors if tensors is not None else config_tensors(shape, dtype))

    @classmethod
    def from_folder(cls, folder: Path, num_layers: int | None = None, name: str | None = None) -> ModelShape:
        """config.json and, where there are *.safetensors files, their headers; num_layers: only the
        first layers (`self:K` on vLLM loads just those)."""
        folder = Path(folder)
        config_path = folder / "config.json"
        if not config_path.is_file():
            raise ModelError(f"model folder {folder} has no config.json")
        files = sorted(folder.glob("*.safetensors"))
        tensors = tuple(t for f in files for t in safetensors_tensors(f)) if files else None
        shape = cls.from_config(name or folder.name, json.loads(config_path.read_text()), str(config_path), tensors)
        return shape if num_layers is None else shape.first_layers(num_layers)


def config_tensors(shape: ModelShape, dtype: str) -> tuple[Tensor, ...]:
    """Every weight of a Llama-style decoder of this shape, stored in dtype (module docstring)."""
    h, d, st = shape.hidden_size, shape.head_dim, TORCH_TO_SAFETENSORS[dtype]
    q, kv, mlp = shape.num_heads * d * h, shape.num_kv_heads * d * h, shape.intermediate_size * h
    out = [Tensor("model.embed_tokens.weight", shape.vocab_size * h, st)]
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        out += [Tensor(p + "self_attn.q_proj.weight", q, st), Tensor(p + "self_attn.k_proj.weight", kv, st),
                Tensor(p + "self_attn.v_proj.weight", kv, st), Tensor(p + "self_attn.o_proj.weight", q, st),
                Tensor(p + "mlp.gate_proj.weight", mlp, st), Tensor(p + "mlp.up_proj.weight", mlp, st),
                Tensor(p + "mlp.down_proj.weight", mlp, st),
                Tensor(p + "input_layernorm.weight", h, st), Tensor(p + "post_attention_layernorm.weight", h, st)]
    out.append(Tensor("model.norm.weight", h, st))
    if not shape.tie_word_embeddings:
        out.append(Tensor("lm_head.weight", shape.vocab_size * h, st))
    return tuple(out)


def safetensors_tensors(path: Path) -> list[Tensor]:
    """The tensors of one safetensors file, from its header (8-byte little-endian length + JSON)."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, struct.error, ValueError) as e:
        raise ModelError(f"{path}: not a readable safetensors file ({e})") from None
    return [Tensor(k, math.prod(t["shape"]), t["dtype"]) for k, t in header.items() if k != "__metadata__"]
