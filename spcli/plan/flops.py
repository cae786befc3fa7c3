"""Prefill FLOPs and the limit they put on the TTFT speed-up, per speculator placement.

For a decoder of L layers, per-layer matmul weights P_l (`ModelShape.layer_linear_params`), H query
heads of dimension D, vocabulary V and width h, a causal prefill of t tokens costs

    F(t) = 2 * L * P_l * t                 every matmul weight: one multiply and one add per token
         + 2 * L * H * D * t * (t + 1)     attention: t(t+1)/2 causal query-key pairs, 2D FLOPs each for
                                           q.k and 2D for the weighted sum of v, per head and layer
         + 2 * V * h                       the LM head, for the last token only

Embedding look-ups, norms, RoPE and softmax are not counted (they are O(t * h), not O(t * h^2) or
O(t^2 * h)). FLOPs count the same at any precision: on H100s an FP8 matmul runs at twice bf16's
peak, which this limit does not model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spcli.config.scoring import ScoreConfig
from spcli.plan.memory import layers_run
from spcli.plan.shapes import ModelShape

PLACEMENTS = ("driver", "workers")


def linear_flops(shape: ModelShape, num_layers: int, num_tokens: int) -> int:
    return 2 * num_layers * shape.layer_linear_params * num_tokens


def causal_attention_flops(shape: ModelShape, num_layers: int, num_tokens: int) -> int:
    return 2 * num_layers * shape.num_heads * shape.head_dim * num_tokens * (num_tokens + 1)


def lm_head_flops(shape: ModelShape, num_rows: int) -> int:
    return 2 * shape.vocab_size * shape.hidden_size * num_rows


def prefill_flops(shape: ModelShape, num_tokens: int) -> int:
    """F(t) of the module docstring: t tokens through every layer, attending causally to each other.
    The full prefill runs t = n; the pruned base runs t = m kept tokens, which attend only to kept
    tokens (their KV cache holds nothing else)."""
    n = num_tokens
    return linear_flops(shape, shape.num_layers, n) + causal_attention_flops(shape, shape.num_layers, n) + lm_head_flops(shape, 1)


def speculator_flops(shape: ModelShape, num_tokens: int, score: ScoreConfig) -> int:
    """One prompt's speculator pass (`score` resolved): all n tokens through the L_r layers it runs
    (`layers_run`: up to the last scored layer without look-ahead), then with look-ahead A decoded
    tokens, each through all L layers attending to about n keys, and an LM head row per forward;
    then scoring, q.k over n keys for R = W + A rows at S scored layers:

        F_s = 2 * L_r * P_l * n + 2 * L_r * H * D * n * (n + 1)
            + A * (2 * L * P_l + 4 * L * H * D * n) + (A + 1) * 2 * V * h      (look-ahead only)
            + 2 * S * H * R * D * n
    """
    n, a = num_tokens, score.lookahead or 0
    lr = layers_run(shape, score)
    total = linear_flops(shape, lr, n) + causal_attention_flops(shape, lr, n)
    if a:
        l, hd = shape.num_layers, shape.num_heads * shape.head_dim
        total += a * (linear_flops(shape, l, 1) + 4 * l * hd * n) + lm_head_flops(shape, a + 1)
    rows = score.num_prompt_rows + a
    return total + 2 * len(score.layers(shape.num_layers)) * shape.num_heads * rows * shape.head_dim * n


@dataclass(frozen=True)
class SpeedupLimit:
    placement: str
    full_flops: int  # B prompts' full prefill
    pruned_flops: int  # B prompts' pruned base prefill
    speculator_flops: int  # B prompts' speculator passes
    speculator_wall_flops: int  # the speculator's FLOPs as the wall clock sees them (placement)

    @property
    def limit(self) -> float:
        return self.full_flops / (self.pruned_flops + self.speculator_wall_flops)


def speedup_limit(base: ModelShape, speculator: ModelShape, score: ScoreConfig, num_tokens: int, keep: float,
                  batch: int, tp: int, placement: str) -> SpeedupLimit:
    """The TTFT speed-up if time were FLOPs / (tp GPUs' equal throughput), for B = batch prompts of n
    tokens keeping m = ceil(keep * n):

        full    = B * F_base(n)                                   split over tp GPUs
        pruned  = B * F_base(m)                                   split over tp GPUs
        spec    = B * F_s(n)
        seen    = tp * spec                  placement driver: one GPU runs it, the tp - 1 others wait
                = tp * ceil(B / tp) * F_s(n) placement workers: each rank scores its share of the prompts
        limit   = full / (pruned + seen)

    (Each side divided by tp: time = FLOPs / (tp x one GPU's rate).)
    """
    assert placement in PLACEMENTS, placement
    m = math.ceil(keep * num_tokens)
    one = speculator_flops(speculator, num_tokens, score)
    seen = tp * batch * one if placement == "driver" else tp * math.ceil(batch / tp) * one
    return SpeedupLimit(placement, batch * prefill_flops(base, num_tokens), batch * prefill_flops(base, m),
                        batch * one, seen)
