"""The run's manifest: what its fingerprint names, opened or resumed, and each shard's progress carried over."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from spcli.errors import OutputError
from spcli.io.manifest import Manifest, ShardProgress, describe_difference, fingerprint, input_identity, manifest_name
from spcli.io.shards import Shard
from spcli.models.resolved import ResolvedRun

log = logging.getLogger("spcli")


def fingerprint_fields(resolved: ResolvedRun, shards: list[Shard]) -> dict:
    from spcli.models.files import load_tokenizer
    from spcli.models.speculator import CROSS_TOKENIZER

    fields = resolved.cfg.fingerprint_fields()
    fields["model_path"] = str(resolved.model_path)
    fields["speculator"] = resolved.speculator
    if resolved.scoring == CROSS_TOKENIZER:  # absent for the same ids, as before: old directories still resume
        fields["scoring"] = resolved.scoring
    if getattr(load_tokenizer(resolved.model_path), "chat_template", None) is not None:
        # a raw prompt with an instruction reads through the chat template since issue 40 (tokenize.chat_form): a
        # directory made before then (raw text) is refused on resume rather than mixing the two forms
        fields["raw_prompt_with_instruction"] = "chat template"
    fields["dtype"] = resolved.dtype  # what the models load in
    if resolved.prunes and resolved.speculator_dtype != resolved.dtype:  # absent where equal, as before: those resume
        fields["speculator_dtype"] = resolved.speculator_dtype
    fields["device_type"] = resolved.device.type  # cpu and cuda kernels round bf16 differently
    fields["inputs"] = [{k: v for k, v in s.items() if k != "index"} for s in input_identity(shards)]
    return fields


def made_with(cfg, out: Path, task: dict | None) -> dict | None:
    """The fingerprint fields of the rows `out` already holds for this task (None: a new directory, --fresh, or
    nothing committed yet): what an auto setting resolves against (groups_for, speculator_dtype_for)."""
    path = out / manifest_name(task["index"] if task else None)
    old = None if cfg.fresh or not path.exists() else Manifest.load(path)
    return old.fingerprint_fields if old is not None and old.committed_parts() else None


def groups_for(resolved: ResolvedRun, out: Path, task: dict | None) -> ResolvedRun:
    """--groups auto, resolved against the directory it continues: groups shard on a new directory (or one that made
    them); on a directory whose rows were made before groups (its fingerprint names no group rule), each record alone;
    on one made with the consecutive rule (before --groups shard: its fingerprint's groups "auto"), that rule. So an
    old directory resumes as its rows were made."""
    cfg = resolved.cfg
    if cfg.groups != "auto":
        return resolved
    made = made_with(cfg, out, task)
    groups = resumed_groups(made) if made is not None else "shard"
    if groups == "off":
        log.info("groups: off (%s was made before document groups; its rows were made one record at a time)", out)
    elif groups == "consecutive":
        log.info("groups: consecutive (%s was made with the consecutive rule, before --groups shard; it resumes with it)",
                 out)
    return dataclasses.replace(resolved, cfg=dataclasses.replace(cfg, groups=groups))


def speculator_dtype_for(resolved: ResolvedRun, out: Path, task: dict | None) -> ResolvedRun:
    """--speculator-dtype auto, resolved against the directory it continues: on a directory whose rows were scored
    with the speculator in the run's dtype (its fingerprint names no speculator_dtype: made so, or before the flag),
    the run's dtype, so that it resumes as its rows were made; elsewhere what resolve_run picked."""
    cfg = resolved.cfg
    if not resolved.is_speculator_dtype_auto or resolved.speculator_dtype == resolved.dtype:
        return resolved
    made = made_with(cfg, out, task)
    if made is None or "speculator_dtype" in made:
        return resolved
    log.info("speculator dtype: %s (%s was scored in the run's dtype; it resumes so)", resolved.dtype, out)
    return dataclasses.replace(resolved, cfg=dataclasses.replace(cfg, speculator_dtype=resolved.dtype),
                               speculator_dtype_why=f"the run's dtype, as {out} was made")


def resumed_groups(fingerprint_fields: dict) -> str:
    """The --groups rule a directory's rows were made with, from its fingerprint (RunConfig.fingerprint_fields)."""
    if "group_rule" not in fingerprint_fields:
        return "off"
    return "consecutive" if fingerprint_fields.get("groups") == "auto" else "shard"


def open_manifest(resolved: ResolvedRun, out: Path, shards: list[Shard], task: dict | None,
                  inputs: list[Shard] | None = None) -> Manifest:
    """The manifest to continue: a new one, or the directory's (checked against this configuration).

    A manifest that committed no part holds no outputs, so it never refuses another configuration.
    inputs: the shards its fingerprint names (default: `shards`; a pool worker's: every shard of the job).
    """
    cfg = resolved.cfg
    fields = fingerprint_fields(resolved, shards if inputs is None else inputs)
    path = out / manifest_name(task["index"] if task else None)
    old = None if cfg.fresh or not path.exists() else Manifest.load(path)
    if old is None or not old.committed_parts():
        return Manifest(path, cfg.to_dict(), fields, {s.index: ShardProgress.start(s) for s in shards}, task)
    if old.fingerprint != fingerprint(fields):
        diffs = describe_difference(old.fingerprint_fields, fields)
        what = "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
        if not cfg.force and all(d.startswith("inputs.") for d in diffs):
            again = "--retry-failed --force redoes its failed rows from them" if cfg.retry_failed else "--force goes on"
            raise OutputError(
                f"{out}: the input files changed since its rows were made ({what}); {again} (rows already made stay "
                "as they were), --fresh redoes every row"
            )
        if not cfg.force:
            raise OutputError(
                f"{out} holds a run with another configuration ({what}); "
                "rerun with --fresh to start over (deletes its outputs) or --force to append anyway"
            )
        if not all(old.shards[i].done for i in old.shards if old.shards[i].key in {s.key for s in shards}):
            log.warning("--force: appending to outputs made with another configuration (%s)", what)
        elif not cfg.retry_failed:
            log.warning("--force: every shard in %s is already done, so no row is made with this configuration (%s); "
                        "its outputs are left as they were: --fresh redoes them with it, or give another --out", out, what)
        old.use_config(cfg.to_dict(), fields)  # the parts made so far keep their configuration
    old.task, old.finished = task, False
    old.shards = merge_progress(old.shards, shards)
    return old


def merge_progress(old: dict[int, ShardProgress], shards: list[Shard]) -> dict[int, ShardProgress]:
    """This run's shards, each with its committed progress (matched by path and row range); others keep theirs,
    re-keyed."""
    by_key = {p.key: p for p in old.values()}
    merged = {s.index: by_key.pop(s.key, None) or ShardProgress.start(s) for s in shards}
    key = max([*merged, *old, -1]) + 1
    for prog in by_key.values():  # shards not in this run's inputs: their parts stay committed
        merged[key], key = prog, key + 1
    return merged
