"""spcli/ray/slots.py: which slot and shards each actor takes (no Ray needed), and the directories --ray refuses."""

from __future__ import annotations

import json

import pytest

from spcli.errors import OutputError
from spcli.io.shards import Shard
from spcli.ray.slots import Slots, WorkQueue, read_slots

PATHS = [f"/in/s{i}.jsonl" for i in range(6)]
SHARDS = [Shard(i, p) for i, p in enumerate(PATHS)]


def keys(shards) -> tuple[str, ...]:
    return tuple(s.key for s in shards)


def test_fresh_shards_go_out_in_order_each_into_its_actors_slot():
    q = WorkQueue(SHARDS, Slots(), num_workers=2)
    a, b = q.take(0), q.take(1)
    assert (a.slot, keys(a.shards), b.slot, keys(b.shards)) == (0, (PATHS[0],), 1, (PATHS[1],))
    q.finish(a)
    c = q.take(0)
    assert (c.slot, keys(c.shards), keys(c.owned)) == (0, (PATHS[2],), (PATHS[0], PATHS[2]))  # the manifest lists both


def test_a_dead_actors_work_goes_back_to_its_slot_first():
    q = WorkQueue(SHARDS, Slots(), num_workers=2)
    a, b = q.take(0), q.take(1)
    q.give_back(b)  # actor 1 died mid-shard
    q.finish(a)
    assert keys(q.take(0).shards) == (PATHS[2],)  # actor 0 never takes slot 1's shard: its rows are in slot 1's manifest
    again = q.take(1)  # the new actor 1
    assert (again.slot, keys(again.shards)) == (1, (PATHS[1],))


def test_resume_finishes_each_slots_shards_and_orphan_slots_go_to_any_free_actor():
    slots = Slots(owner={PATHS[0]: 0, PATHS[1]: 1, PATHS[2]: 2, PATHS[3]: 2}, done={PATHS[0], PATHS[2]})
    q = WorkQueue(SHARDS, slots, num_workers=2)  # the earlier run had 3 actors
    first = q.take(0)
    assert (first.slot, keys(first.shards), keys(first.owned)) == (2, (PATHS[3],), (PATHS[2], PATHS[3]))  # orphan slot 2
    second = q.take(1)
    assert (second.slot, keys(second.shards)) == (1, (PATHS[1],))
    q.finish(first)
    assert keys(q.take(0).shards) == (PATHS[4],)
    assert q.num_slots == 3


def test_retry_calls_each_slot_with_error_rows_once_done_or_not_and_again_after_its_actor_died():
    slots = Slots(owner={PATHS[0]: 0, PATHS[1]: 1, PATHS[2]: 2}, done={PATHS[0], PATHS[1]},
                  failed={PATHS[0]: 2, PATHS[2]: 1})
    q = WorkQueue(SHARDS, slots, num_workers=2, retry=True)
    a = q.take(0)
    assert (a.slot, keys(a.shards), a.retry) == (0, (), True)  # done, but with error rows: called to redo them
    b = q.take(1)  # slot 1 has no error rows: actor 1 takes the orphan slot 2 (not done, one error row)
    assert (b.slot, keys(b.shards), b.retry) == (2, (PATHS[2],), True)
    q.give_back(b)  # its actor died mid-retry: the rows it had not redone are still error rows
    q.finish(a)
    again = q.take(0)
    assert (again.slot, keys(again.shards), again.retry) == (2, (PATHS[2],), True)
    q.finish(again)
    nxt = q.take(0)
    assert (nxt.slot, keys(nxt.shards), nxt.retry) == (0, (PATHS[3],), False)  # once per run
    assert not WorkQueue(SHARDS, slots, num_workers=2).take(0).retry  # without --retry-failed


def test_read_slots_refuses_other_runs_directories(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"task": None, "shards": {}}))
    with pytest.raises(OutputError, match="without --ray"):
        read_slots(tmp_path)
    (tmp_path / "manifest.json").unlink()
    (tmp_path / "manifest-task-00000.json").write_text(json.dumps({"task": {"index": 0, "count": 2}, "shards": {}}))
    with pytest.raises(OutputError, match="Slurm array"):
        read_slots(tmp_path)


def test_read_slots_reads_owners_and_progress(tmp_path):
    for slot, shards in ((0, {"0": (PATHS[0], True, 5)}), (1, {"1": (PATHS[1], False, 2)})):
        doc = {"task": {"index": slot, "count": 2, "ray": True},
               "shards": {k: {"path": p, "done": d, "rows": r, "next_row": r, "total_rows": 5} for k, (p, d, r) in shards.items()}}
        (tmp_path / f"manifest-task-{slot:05d}.json").write_text(json.dumps(doc))
    slots = read_slots(tmp_path)
    assert slots.owner == {PATHS[0]: 0, PATHS[1]: 1} and slots.done == {PATHS[0]} and slots.rows[PATHS[1]] == 2


def test_fresh_removes_the_slots_outputs_unless_an_actor_holds_one(tmp_path):
    """--fresh with --ray (driver.start_over): the manifests first, then parts and temp files; refused while a live
    process holds a slot's lock."""
    from spcli.config.run import RunConfig
    from spcli.errors import ConfigError, OutputError
    from spcli.io.lock import WriterLock
    from spcli.ray.driver import start_over

    for name in ("manifest-task-00000.json", "manifest-task-00001.json", "part-00000-00000.parquet",
                 "part-00001-00003.jsonl", ".part-00002-00000.parquet.9-ab.tmp", ".manifest-task-00001.json.4-cd.tmp"):
        (tmp_path / name).write_text("x")
    lock = WriterLock(tmp_path, 1)
    lock.acquire()
    try:
        with pytest.raises(OutputError, match="lock-task-00001 is held by a running actor of another run"):
            start_over(tmp_path)
    finally:
        lock.release()
    (tmp_path / ".lock-task-00000").write_text("{}")  # a killed actor's: nobody holds it
    assert start_over(tmp_path).owner == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock-task-00000"]
    RunConfig(inputs=("x",), out="y", ray="auto", fresh=True)
    with pytest.raises(ConfigError, match="--fresh and --retry-failed cannot be used together"):
        RunConfig(inputs=("x",), out="y", ray="auto", fresh=True, retry_failed=True)
