"""Which manifest slot and shards each Ray actor takes next: the work queue of `spcli run --ray`.

A slot is one worker manifest, `manifest-task-<slot>.json`, written the way a Slurm array task writes its
own (spcli/run.py with a WorkerShare). A shard belongs to the slot whose manifest lists it from its first
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
from spcli.io.manifest import read_manifests

RAY_TASK = "ray"  # the key a Ray slot's task record carries (manifest "task": {"index": k, "ray": true, ...})


@dataclass(frozen=True)
class Work:
    """One actor call: run `paths` (not done yet) in `slot`'s manifest, which also lists `owned`."""

    slot: int
    paths: tuple[str, ...]
    owned: tuple[str, ...]  # every shard the slot's manifest lists (done or not), `paths` included


@dataclass
class Slots:
    """What the directory's manifests say: each started shard's slot, and which shards are done."""

    owner: dict[str, int] = field(default_factory=dict)  # shard path -> the slot whose manifest lists it
    done: set[str] = field(default_factory=set)
    rows: dict[str, int] = field(default_factory=dict)  # committed rows per shard
    total_rows: dict[str, int | None] = field(default_factory=dict)  # when the manifest knows it

    @property
    def num_slots(self) -> int:
        return max(self.owner.values(), default=-1) + 1


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
        for prog in doc["shards"].values():
            path = prog["path"]
            if path in slots.owner and slots.owner[path] != task["index"]:
                raise OutputError(f"{out}: shard {path} is listed by two manifests (slots {slots.owner[path]} and "
                                  f"{task['index']}); the directory was changed by hand: use a new --out")
            slots.owner[path] = task["index"]
            slots.rows[path] = prog["rows"]
            slots.total_rows[path] = prog.get("total_rows")
            if prog["done"]:
                slots.done.add(path)
    return slots


class WorkQueue:
    """The work left, in input order, handed to actors as they free up (`take`); work an actor did not finish
    goes back (`give_back`) to the front of its slot."""

    def __init__(self, paths: list[str], slots: Slots, num_workers: int):
        self.num_workers = num_workers
        self.owned: dict[int, list[str]] = {}
        self.left: dict[int, list[str]] = {}  # slot -> its shards not done yet, in input order
        for path in paths:
            slot = slots.owner.get(path)
            if slot is not None:
                self.owned.setdefault(slot, []).append(path)
                if path not in slots.done:
                    self.left.setdefault(slot, []).append(path)
        self.fresh = deque(p for p in paths if p not in slots.owner)
        self.busy: set[int] = set()

    @property
    def num_slots(self) -> int:
        return max([self.num_workers - 1, *self.owned]) + 1

    def take(self, worker: int) -> Work | None:
        """The next work of actor `worker`: what its own slot left, else an orphan slot's (one above the pool),
        else the next shard no slot holds yet (into its own slot). None: nothing it may take now."""
        if self.left.get(worker):
            return self._start(worker, self.left.pop(worker))
        for slot in sorted(self.left):
            if slot >= self.num_workers and slot not in self.busy and self.left[slot]:
                return self._start(slot, self.left.pop(slot))
        if self.fresh:
            path = self.fresh.popleft()
            self.owned.setdefault(worker, []).append(path)
            return self._start(worker, [path])
        return None

    def _start(self, slot: int, paths: list[str]) -> Work:
        assert slot not in self.busy, "one actor per slot at a time"
        self.busy.add(slot)
        return Work(slot, tuple(paths), tuple(self.owned[slot]))

    def finish(self, work: Work) -> None:
        self.busy.discard(work.slot)

    def give_back(self, work: Work) -> None:
        """Work whose actor died: its slot finishes it first (the committed part of it stays where it is)."""
        self.busy.discard(work.slot)
        self.left[work.slot] = list(work.paths) + self.left.get(work.slot, [])

    @property
    def is_empty(self) -> bool:
        return not self.fresh and not any(self.left.values())
