"""`spcli plan`: per-GPU memory, KV capacity, the batch that fits and the speed-up limit, from configs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

HELP = ("Print the plan of a vLLM run without loading weights: per-GPU base weights, the speculator's reserve, "
        "gpu_memory_utilization, KV bytes per token and KV capacity per GPU, how many prompts of --length fit at once "
        "at --keep, the longest max_model_len that fits, and the FLOP limit of the TTFT speed-up per placement.\n\n"
        "The facts come from the models' config.json (and safetensors headers) when they are on this machine, else "
        "from the configs shipped for the presets. Placement driver: the speculator runs on GPU 0 only while the "
        "other GPUs wait; workers: a replica on every GPU, each rank scoring its share of the prompts. The formulas "
        "are in the docstrings of spcli/plan/memory.py and spcli/plan/flops.py.")


def register(app: typer.Typer) -> None:
    @app.command(name="plan", help=HELP)
    def _cmd(
        model: Annotated[str, typer.Option(help="Base model: a preset (see `spcli models`), local folder or cached HF id.")] = "llama-405b-fp8",
        speculator: Annotated[Optional[str], typer.Option(help="Speculator model or self:K. Default: the model's.")] = None,
        tp: Annotated[Optional[int], typer.Option(help="Tensor-parallel size. Default: the model's.")] = None,
        gpu_memory: Annotated[float, typer.Option(help="Memory per GPU in GiB (an H100 80GB reports 79.6 GiB).")] = 80.0,
        length: Annotated[int, typer.Option(help="Prompt length n in tokens.")] = 32768,
        keep: Annotated[float, typer.Option(help="Fraction of prompt tokens the base prefills.")] = 0.1,
        batch: Annotated[int, typer.Option(help="Prompts prefilled together (for the speed-up limit).")] = 16,
        max_tokens: Annotated[int, typer.Option(help="Tokens generated per prompt (KV tokens = kept + this).")] = 64,
        placement: Annotated[Optional[str], typer.Option(help="driver or workers. Default: both.")] = None,
        kv_cache_dtype: Annotated[str, typer.Option(help="auto (the model's dtype) or fp8.")] = "auto",
        speculator_chunk: Annotated[int, typer.Option(help="Tokens the speculator prefills per forward (its activations).")] = 8192,
        max_model_len: Annotated[Optional[int], typer.Option(help="The base's longest request (kept + generated tokens). Default: the preset's, else the model's context.")] = None,
        max_prompt_len: Annotated[Optional[int], typer.Option(help="The speculator's longest prompt; sizes its reserve. Default: the base's positions, or the longest whose reserve leaves room for one --max-model-len request.")] = None,
        lookahead: Annotated[Optional[int], typer.Option(help="Speculator look-ahead tokens. Default: the model's.")] = None,
        window: Annotated[Optional[int], typer.Option(help="Last W prompt tokens' queries score. Default: the model's.")] = None,
        score_layers: Annotated[Optional[str], typer.Option(help="Speculator layers that score. Default: the model's.")] = None,
    ) -> None:
        from spcli.config.scoring import ScoreConfig
        from spcli.plan.plan import PlanConfig, make_plan
        from spcli.plan.report import plan_lines

        cfg = PlanConfig(
            model=model, speculator=speculator, tp=tp, gpu_memory_gib=gpu_memory, length=length, keep=keep, batch=batch,
            max_tokens=max_tokens, placement=placement, kv_cache_dtype=kv_cache_dtype, speculator_chunk=speculator_chunk,
            max_model_len=max_model_len, max_prompt_len=max_prompt_len, score=ScoreConfig(lookahead=lookahead, window=window, score_layers=score_layers),
        )
        typer.echo("\n".join(plan_lines(make_plan(cfg))))
