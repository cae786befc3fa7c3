"""Which manifest slot and shards each Ray actor takes next: the work queue of `spcli run --ray`.

A slot is one worker manifest, `manifest-task-<slot>.json`, written the way a Slurm array task writes its
own (spcli/job/run.py with a WorkerShare). A shard belongs to the slot whose manifest lists it from its first
commit on, so that its committed rows live in one manifest only (readers merge them as Slurm tasks' are
merged). Actor w works in slot w; a replacement actor for w (the first one died) takes slot w and first
finishes what its predecessor left there. Slots above the pool's size (an earlier run had more actors) are
finished by whichever actor is free, one actor per slot at a time. Shards no slot holds yet are handed out
in input order as actors free up.

Pure bookkeeping over the manifests' documents; the driver (spcli/ray/driver.py) asks Ray to run the work.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from spcli.errors import OutputError
from spcli.io.manifest import progress_key, progress_rows, read_manifests
from spcli.io.shards import Shard

RAY_TASK = "ray"  # the key a Ray slot's task record carries (manifest "task": {"index": k, "ray": true, ...})


@dataclass(frozen=True)
class Work:
    """One actor call: run `shards` (not done yet) in `slot`'s manifest, which also lists `owned`."""

    slot: int
    shards: tuple[Shard, ...]
    owned: tuple[Shard, ...]  # every shard (or row range) the slot's manifest lists (done or not), `shards` included
    retry: bool = False  # --retry-failed: the slot's committed error rows are redone first (once per run)

    @property
    def keys(self) -> str:
        return ", ".join(s.key for s in self.shards) or "its failed rows"


@dataclass
class Slots:
    """What the directory's manifests say, by `Shard.key` (a file, or a row range of one): each started one's slot
    and manifest index, its row range, and which are done."""

    owner: dict[str, int] = field(default_factory=dict)  # key -> the slot whose manifest lists it
    index: dict[str, int] = field(default_factory=dict)  # key -> its index in that manifest (names its parts)
    path: dict[str, str] = field(default_factory=dict)  # key -> its file
    row_range: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    rows: dict[str, int] = field(default_factory=dict)  # committed rows
    failed: dict[str, int] = field(default_factory=dict)  # committed error rows
    total_rows: dict[str, int | None] = field(default_factory=dict)  # when the manifest knows it

    @property
    def num_slots(self) -> int:
        return max(self.owner.values(), default=-1) + 1

    def failed_rows(self, units: list[Shard]) -> int:
        """The committed error rows of these units (what --retry-failed redoes)."""
        return sum(self.failed.get(u.key, 0) for u in units)

    def keys_by_path(self) -> dict[str, list[str]]:
        """The keys manifests list, by file (the whole file, or ranges of its rows)."""
        by_path: dict[str, list[str]] = {}
        for key, path in self.path.items():
            by_path.setdefault(path, []).append(key)
        return by_path


def read_slots(out: Path) -> Slots:
    """The Ray slots of an output directory; a directory written by a plain run or a Slurm array is refused
    (its manifests split the shards another way, so their rows would be written a second time)."""
    slots = Slots()
    if not out.is_dir():
        return slots
    for doc in read_manifests(out):
        task = doc.get("task") or {}
        if not task.get(RAY_TASK):
            made_by = "a Slurm array (spcli slurm submit)" if task else "spcli run without --ray (manifest.json)"
            raise OutputError(f"{out} holds a run made by {made_by}; go on with that, or give --ray a new --out")
        for index, prog in doc["shards"].items():
            key = progress_key(prog)
            if key in slots.owner and slots.owner[key] != task["index"]:
                raise OutputError(f"{out}: shard {key} is listed by two manifests (slots {slots.owner[key]} and "
                                  f"{task['index']}); the directory was changed by hand: use a new --out")
            slots.owner[key], slots.index[key], slots.path[key] = task["index"], int(index), prog["path"]
            slots.row_range[key] = progress_rows(prog)
            slots.rows[key], slots.failed[key] = prog["rows"], prog.get("failed", 0)
            slots.total_rows[key] = prog.get("total_rows")
            if prog["done"]:
                slots.done.add(key)
    return slots


class WorkQueue:
    """The work left, in input order, handed to actors as they free up (`take`); work an actor did not finish
    goes back (`give_back`) to the front of its slot. The units are shards or row ranges of them (pieces.py).
    retry (--retry-failed): each slot with committed error rows is called once with `Work.retry`, done or not."""

    def __init__(self, shards: list[Shard], slots: Slots, num_workers: int, retry: bool = False):
        self.num_workers = num_workers
        self.retry = {slots.owner[s.key] for s in shards if slots.failed.get(s.key)} if retry else set()
        self.owned: dict[int, list[Shard]] = {}
        self.left: dict[int, list[Shard]] = {}  # slot -> its shards not done yet, in input order
        for shard in shards:
            slot = slots.owner.get(shard.key)
            if slot is not None:
                self.owned.setdefault(slot, []).append(shard)
                if shard.key not in slots.done:
                    self.left.setdefault(slot, []).append(shard)
        self.fresh = deque(s for s in shards if s.key not in slots.owner)
        self.busy: set[int] = set()

    @property
    def num_slots(self) -> int:
        return max([self.num_workers - 1, *self.owned]) + 1

    def take(self, worker: int) -> Work | None:
        """The next work of actor `worker`: what its own slot left, else an orphan slot's (one above the pool),
        else the next shard no slot holds yet (into its own slot). None: nothing it may take now."""
        if self.left.get(worker) or worker in self.retry:
            return self._start(worker, self.left.pop(worker, []))
        for slot in sorted({*self.left, *self.retry}):
            if slot >= self.num_workers and slot not in self.busy and (self.left.get(slot) or slot in self.retry):
                return self._start(slot, self.left.pop(slot, []))
        if self.fresh:
            shard = self.fresh.popleft()
            self.owned.setdefault(worker, []).append(shard)
            return self._start(worker, [shard])
        return None

    def _start(self, slot: int, shards: list[Shard]) -> Work:
        assert slot not in self.busy, "one actor per slot at a time"
        self.busy.add(slot)
        retry = slot in self.retry
        self.retry.discard(slot)
        return Work(slot, tuple(shards), tuple(self.owned[slot]), retry)

    def finish(self, work: Work) -> None:
        self.busy.discard(work.slot)

    def give_back(self, work: Work) -> None:
        """Work whose actor died: its slot finishes it first (the committed part of it stays where it is)."""
        self.busy.discard(work.slot)
        self.left[work.slot] = list(work.shards) + self.left.get(work.slot, [])
        if work.retry:  # the rows it had not redone are still error rows
            self.retry.add(work.slot)

    @property
    def is_empty(self) -> bool:
        return not self.fresh and not any(self.left.values()) and not self.retry
