"""`spcli run ... --ray [ADDRESS]`: the job on a pool of Ray actors, with a manifest per actor slot.

The driver checks the inputs, joins the cluster, starts one actor per worker (each in a placement group of
its own: spcli/ray/cluster.py) and hands each free actor its next work (spcli/ray/slots.py); Ray schedules
and runs them. An actor that dies (its node lost, killed, out of memory) is replaced by a new one in the
same slot, which resumes after the slot's last commit: no row is lost, none is written twice. A stopped
or killed driver takes its actors with it (they are its children in Ray); the same command resumes.
Progress shows every actor's committed rows; the done line is the directory's, as `spcli run`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from pathlib import Path

from spcli.config.run import SPLIT_ROWS, RunConfig
from spcli.errors import EngineDied, Interrupted, OutputError, SpcliError
from spcli.io.count import count_rows
from spcli.io.lock import WriterLock
from spcli.io.manifest import read_manifests
from spcli.io.outdir import check_out, prepare_out
from spcli.io.read import check_shard
from spcli.io.shards import Shard, discover
from spcli.job.progress import Progress
from spcli.job.stop import StopRequest
from spcli.job.summary import RunSummary
from spcli.ray.cluster import actor_shape, connect, require_ray
from spcli.ray.pieces import group_split_rows, split
from spcli.ray.slots import Slots, Work, WorkQueue, read_slots
from spcli.ray.worker import Worker

log = logging.getLogger("spcli")

MAX_DEATHS = 3  # actors of one slot that may die in a row on the same work before the run gives up
POLL_S = 0.5  # how often the driver looks at progress and a stop while actors run
CLOSE_S = 60.0  # how long finished actors may take to end their engines before they are ended


def ray_groups(cfg: RunConfig, out: Path) -> RunConfig:
    """--groups auto on a directory whose slots made their rows with the consecutive rule (before --groups shard): that
    rule for every slot, new ones included (each slot's own manifest resolves the rest: job.manifest.groups_for)."""
    if cfg.groups != "auto" or cfg.fresh or not out.is_dir():
        return cfg
    from spcli.io.manifest import read_manifests
    from spcli.job.manifest import resumed_groups

    made = {resumed_groups(d.get("fingerprint_fields") or {}) for d in read_manifests(out)
            if any(p.get("parts") for p in d.get("shards", {}).values())}
    return dataclasses.replace(cfg, groups="consecutive") if "consecutive" in made else cfg


def run_on_ray(cfg: RunConfig, progress: Progress | None = None) -> RunSummary:
    out = Path(cfg.out)
    check_out(out)
    shards = discover(cfg.inputs, exclude=out)
    for s in shards:
        warning = check_shard(s, cfg.fields)
        if warning is not None:
            log.warning("%s", warning)
    slots = read_slots(out)
    gone = sorted(set(slots.path.values()) - {s.path for s in shards})
    if gone and not cfg.fresh:
        raise OutputError(f"{out}: shard {gone[0]} was run here and is no longer among the inputs; give the same inputs")
    progress = progress or Progress(total=None)
    cfg = ray_groups(cfg, out)
    split_rows = group_split_rows(SPLIT_ROWS if cfg.split_rows is None else cfg.split_rows, cfg)
    if cfg.split_rows and not split_rows:
        log.info("--split-rows %d not used: with --groups shard each file runs whole (a row range could cut a "
                 "document's group); --groups consecutive runs ranges", cfg.split_rows)
    units = split(shards, slots, split_rows)
    to_retry = slots.failed_rows(units) if cfg.retry_failed else 0
    if all(u.key in slots.done for u in units) and not to_retry and not cfg.fresh:
        return _summary(RunSummary, out, len(shards), progress, 0.0, nothing_to_do=True)
    ray = require_ray()
    started = connect(cfg.ray)
    existed = out.exists()
    prepare_out(out)
    lock = WriterLock(out, None, warn=log.warning)  # one driver per directory; each slot has its own lock
    t0 = time.perf_counter()
    try:
        with StopRequest(log=log.warning) as stop:
            lock.acquire()
            try:
                if cfg.fresh:  # under the driver's lock; the actors then run as on a new directory
                    slots = start_over(out)  # (--fresh refuses --retry-failed: to_retry stays 0)
                    units = split(shards, slots, split_rows)
                    cfg = dataclasses.replace(cfg, fresh=False)
                retried = _drive(ray, cfg, shards, units, slots, to_retry, progress, stop)
            finally:
                lock.release()
    except BaseException:
        if not existed and not any(out.iterdir()):
            out.rmdir()
        raise
    finally:
        if started:
            ray.shutdown()
    progress.close()
    return _summary(RunSummary, out, len(shards), progress, time.perf_counter() - t0, retried=retried)


def start_over(out: Path) -> Slots:
    """--fresh with --ray: every slot's manifest removed, then every part and temporary file (the manifests first:
    a part no manifest lists is uncommitted, so a driver killed halfway leaves what any next run cleans up).
    Refused while a live process holds a slot's lock (an actor of another driver). Unlike a plain run's --fresh,
    the model is not loaded first: the actors load it, on their nodes."""
    from spcli.io.commit import remove_uncommitted
    from spcli.io.lock import is_held

    held = sorted(p.name for p in out.glob(".lock-task-*") if is_held(p))
    if held:
        raise OutputError(f"{out}: {held[0]} is held by a running actor of another run; stop it before --fresh")
    manifests = sorted(out.glob("manifest-task-*.json"))
    for path in manifests:
        path.unlink()
    parts = [name for name in remove_uncommitted(out, set(), None, "") if not name.startswith(".")]  # and part temps
    for temp in out.glob(".manifest-task-*.tmp"):  # a manifest's save cut short
        temp.unlink()
    log.info("--fresh: removed %d manifest(s) and %d output file(s) of the earlier run", len(manifests), len(parts))
    return Slots()


def _drive(ray, cfg: RunConfig, shards: list[Shard], units: list[Shard], slots: Slots, to_retry: int,
           progress: Progress, stop: StopRequest) -> tuple[int, int]:
    """Runs the job on the actors (to_retry: the error rows --retry-failed redoes); returns the failed rows redone
    and how many of them now have no error."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.queue import Empty, Queue
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    shape = actor_shape(cfg, ray.cluster_resources())
    work = WorkQueue(units, slots, shape.num_workers, retry=cfg.retry_failed)
    left = [u for u in units if u.key not in slots.done]
    total = rows_left(shards, units, slots)
    done_before = sum(slots.rows.values())
    ranges = sum(u.rows is not None for u in left)
    queue = Queue(actor_options={"num_cpus": 0})
    remote = ray.remote(Worker)
    run_id = uuid.uuid4().hex[:12]
    level = logging.getLevelName(log.getEffectiveLevel())
    groups: dict = {}  # worker -> its placement group (one bundle), made when its first actor starts

    def start(w: int):
        if w not in groups:
            groups[w] = placement_group([shape.bundle], strategy="STRICT_PACK")
        strategy = PlacementGroupSchedulingStrategy(groups[w], placement_group_bundle_index=0,
                                                    placement_group_capture_child_tasks=True)
        return remote.options(num_cpus=shape.bundle.get("CPU", 0), num_gpus=shape.bundle.get("GPU", 0),
                              scheduling_strategy=strategy, max_restarts=0).remote(cfg, run_id, queue, level)

    actors: dict = {}  # worker -> its actor; a worker with no work at the start is never started
    running: dict = {}  # ObjectRef -> (worker, Work)
    deaths: dict[int, int] = {}
    retried = [0, 0]

    def hand_out(w: int) -> None:
        item = work.take(w)
        if item is not None:
            if w not in actors:
                actors[w] = start(w)
            running[actors[w].run.remote(item.slot, item.owned, work.num_slots, item.retry)] = (w, item)

    def relay() -> None:
        while True:
            try:
                progress.update(queue.get_nowait())
            except Empty:
                return

    try:
        for w in range(shape.num_workers):
            hand_out(w)
        log.info("ray: %d actor(s)%s, each %s, for %d shard(s)%s (%d rows to do) into %s", len(actors),
                 f" (of {shape.num_workers}: the others would have nothing to do)" if len(actors) < shape.num_workers
                 else "", ", ".join(f"{v:g} {k}" for k, v in shape.bundle.items()), len({u.path for u in left}),
                 f" in {len(left)} units ({ranges} row ranges)" if ranges else "", total, cfg.out)
        if done_before:
            log.info("resuming: %d rows already committed", done_before)
        if to_retry:
            log.info("retrying %d failed row%s", to_retry, "" if to_retry == 1 else "s")
        progress.start(total=total + to_retry, done=done_before)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
            relay()
            if stop.requested:
                raise Interrupted(f"stopped by {stop.signal_name}: the actors were ended, what they committed is "
                                  "kept; run the same command again to resume")
            for ref in ready:
                w, item = running.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    _replace(w, item, e, work, deaths)
                    ray.kill(actors[w], no_restart=True)
                    actors[w] = start(w)
                except ray.exceptions.RayTaskError as e:
                    cause = getattr(e, "cause", None)
                    raise cause if isinstance(cause, SpcliError) else e
                else:
                    work.finish(item)
                    deaths.pop(item.slot, None)
                    retried[0] += result["retried"]
                    retried[1] += result["retried_ok"]
                hand_out(w)
                idle = [x for x in actors if all(x != v[0] for v in running.values())]
                for x in idle:
                    hand_out(x)
        relay()
        assert work.is_empty, "every shard was handed out and finished"
        ray.wait([a.close.remote() for a in actors.values()], num_returns=len(actors), timeout=CLOSE_S)
        return retried[0], retried[1]
    finally:
        for a in actors.values():
            ray.kill(a, no_restart=True)
        for g in groups.values():
            remove_placement_group(g)
        ray.kill(queue.actor, no_restart=True)


def rows_left(shards: list[Shard], units: list[Shard], slots: Slots) -> int:
    """Rows no manifest has committed yet: per file, its records (as its units' manifests count them, else as
    read from the file once) less the rows its units committed."""
    by_path: dict[str, list[Shard]] = {}
    for u in units:
        by_path.setdefault(u.path, []).append(u)
    left = 0
    for shard in shards:
        mine = by_path[shard.path]
        if all(u.key in slots.done for u in mine):
            continue
        totals = [slots.total_rows.get(u.key) for u in mine]
        left += (sum(totals) if None not in totals else count_rows(shard)) - sum(slots.rows.get(u.key, 0) for u in mine)
    return left


def _replace(w: int, item: Work, error, work: WorkQueue, deaths: dict[int, int]) -> None:
    deaths[item.slot] = deaths.get(item.slot, 0) + 1
    if deaths[item.slot] > MAX_DEATHS:
        raise EngineDied(f"ray: {MAX_DEATHS + 1} actors in a row died on slot {item.slot} ({item.keys}); "
                         f"the last: {str(error).splitlines()[0]}; committed rows are kept: run the same command again "
                         "to resume")
    log.warning("ray: actor %d died (%s); a new actor takes over slot %d from its last commit (%s)", w,
                str(error).splitlines()[0], item.slot, item.keys)
    work.give_back(item)


def _summary(RunSummary, out: Path, num_shards: int, progress: Progress, wall_s: float, nothing_to_do: bool = False,
             retried: tuple[int, int] = (0, 0)):
    """The directory's totals over every slot's manifest, and this run's own figures (a row redone by --retry-failed
    is not a new row)."""
    docs = read_manifests(out) if out.is_dir() else []
    shards = [p for d in docs for p in d["shards"].values()]
    total = [p.get("total_rows") for p in shards]
    return RunSummary(
        out, rows=sum(p["rows"] for p in shards), failed=sum(p["failed"] for p in shards),
        prompt_tokens=sum(p["prompt_tokens"] for p in shards), kept_tokens=sum(p["kept_tokens"] for p in shards),
        wall_s=sum(d.get("wall_s", 0.0) for d in docs), shards=num_shards,
        rows_total=None if None in total else sum(total), rows_this_run=progress.rows - retried[0], wall_this_run_s=wall_s,
        retried=retried[0], retried_ok=retried[1],
        nothing_to_do=nothing_to_do, prompt_tokens_this_run=progress.prompt_tokens,
        kept_tokens_this_run=progress.kept_tokens, output_tokens_this_run=progress.output_tokens)
