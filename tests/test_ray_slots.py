"""spcli/ray/slots.py: which slot and shards each actor takes (no Ray needed), and the directories --ray refuses."""

from __future__ import annotations

import json

import pytest

from spcli.errors import OutputError
from spcli.ray.slots import Slots, WorkQueue, read_slots

PATHS = [f"/in/s{i}.jsonl" for i in range(6)]


def test_fresh_shards_go_out_in_order_each_into_its_actors_slot():
    q = WorkQueue(PATHS, Slots(), num_workers=2)
    a, b = q.take(0), q.take(1)
    assert (a.slot, a.paths, b.slot, b.paths) == (0, (PATHS[0],), 1, (PATHS[1],))
    q.finish(a)
    c = q.take(0)
    assert (c.slot, c.paths, c.owned) == (0, (PATHS[2],), (PATHS[0], PATHS[2]))  # the manifest lists both


def test_a_dead_actors_work_goes_back_to_its_slot_first():
    q = WorkQueue(PATHS, Slots(), num_workers=2)
    a, b = q.take(0), q.take(1)
    q.give_back(b)  # actor 1 died mid-shard
    q.finish(a)
    assert q.take(0).paths == (PATHS[2],)  # actor 0 never takes slot 1's shard: its rows are in slot 1's manifest
    again = q.take(1)  # the new actor 1
    assert (again.slot, again.paths) == (1, (PATHS[1],))


def test_resume_finishes_each_slots_shards_and_orphan_slots_go_to_any_free_actor():
    slots = Slots(owner={PATHS[0]: 0, PATHS[1]: 1, PATHS[2]: 2, PATHS[3]: 2}, done={PATHS[0], PATHS[2]})
    q = WorkQueue(PATHS, slots, num_workers=2)  # the earlier run had 3 actors
    first = q.take(0)
    assert (first.slot, first.paths, first.owned) == (2, (PATHS[3],), (PATHS[2], PATHS[3]))  # orphan slot 2
    second = q.take(1)
    assert (second.slot, second.paths) == (1, (PATHS[1],))
    q.finish(first)
    assert q.take(0).paths == (PATHS[4],)
    assert q.num_slots == 3


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
