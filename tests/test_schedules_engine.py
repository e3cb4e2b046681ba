"""The recurring-schedule engine with an injected clock: daylight-saving days, catch_up after
downtime, paused schedules and queues, skipping an occurrence, deleted queues, and exactly-once
enqueueing by four processes at once."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.helpers_wait import wait_until
from tickler.config import Settings
from tickler.scheduler import cron
from tickler.scheduler.recurring import MAX_CATCH_UP, enqueue_due
from tickler.scheduler.rules import format_timestamp
from tickler.scheduler.store import ScheduleSpec, Store
from tickler.scheduler.worker import Worker

HOURLY = ScheduleSpec(cron="0 * * * *", timezone="UTC", data={"n": 1})


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def keys(raw: psycopg.Connection[Any], key: str, *, open_only: bool = False) -> list[str]:
    where = " AND dequeued_on IS NULL" if open_only else ""
    found = raw.execute(
        f"SELECT item_key FROM tickler_event_all WHERE item_key LIKE %s{where} ORDER BY schedule_on, id", [key + "@%"]
    ).fetchall()
    return [row[0] for row in found]


def deliver_due(raw: psycopg.Connection[Any], now: datetime) -> None:
    """Finish what came due, as a worker would: the keys are free again afterwards."""
    raw.execute(
        "UPDATE tickler_event SET dequeued_on = %s, dequeued_by = 'w', outcome = 'delivered'"
        " WHERE dequeued_on IS NULL AND schedule_on <= %s",
        [now, now],
    )


def run_clock(engine: sa.Engine, raw: psycopg.Connection[Any], start: datetime, end: datetime, step: timedelta) -> None:
    now = start
    while now <= end:
        enqueue_due(engine, now=now)
        deliver_due(raw, now)
        now += step


@pytest.fixture
def queue(make_queue: Any) -> str:
    make_queue("reports")
    return "reports"


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        # spring forward: 02:00 does not exist; it fires when the clocks jump (03:00 CEST)
        ("2026-03-28T12:00:00Z", ["2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"]),
        # fall back: 02:00 happens twice; it fires once, at the first (02:00 CEST)
        ("2026-10-24T12:00:00Z", ["2026-10-25T00:00:00Z", "2026-10-26T01:00:00Z"]),
    ],
)
def test_daylight_saving_days_fire_once(
    store: Store, engine: sa.Engine, raw: psycopg.Connection[Any], queue: str, start: str, expected: list[str]
) -> None:
    spec = ScheduleSpec(cron="0 2 * * *", timezone="Europe/Berlin", data={})
    begin = at(start)
    store.schedules.put(queue, "nightly", spec, actor="ops", now=begin)
    # every 10 minutes for 30 hours, through the change: the night of the change came due, the
    # next night waits
    run_clock(engine, raw, begin, begin + timedelta(hours=30), timedelta(minutes=10))
    assert keys(raw, "nightly") == [f"nightly@{t}" for t in expected]


def test_every_half_hour_across_the_fall_back_night(
    store: Store, engine: sa.Engine, raw: psycopg.Connection[Any], queue: str
) -> None:
    spec = ScheduleSpec(cron="*/30 * * * *", timezone="Europe/Berlin", data={})
    begin = at("2026-10-24T22:45:00Z")
    store.schedules.put(queue, "half", spec, actor="ops", now=begin)
    run_clock(engine, raw, begin, at("2026-10-25T02:10:00Z"), timedelta(minutes=5))
    # 01:00, 01:30 CEST, 02:00, 02:30 CEST; the repeated 02:00 and 02:30 (CET) are not fired
    # again; 03:00 CET is 02:00Z
    assert keys(raw, "half") == [
        f"half@{t}"
        for t in (
            "2026-10-24T23:00:00Z",
            "2026-10-24T23:30:00Z",
            "2026-10-25T00:00:00Z",
            "2026-10-25T00:30:00Z",
            "2026-10-25T02:00:00Z",
            "2026-10-25T02:30:00Z",
        )
    ]


@pytest.mark.parametrize(
    ("catch_up", "expected_hours"),
    [("latest", [1, 5, 6]), ("none", [1, 6]), ("all", [1, 2, 3, 4, 5, 6])],
)
def test_catch_up_after_downtime(
    store: Store,
    engine: sa.Engine,
    raw: psycopg.Connection[Any],
    queue: str,
    catch_up: str,
    expected_hours: list[int],
) -> None:
    spec = ScheduleSpec(cron="0 * * * *", timezone="UTC", data={}, catch_up=catch_up)
    store.schedules.put(queue, "h", spec, actor="ops", now=at("2026-11-23T00:30:00Z"))
    assert keys(raw, "h") == ["h@2026-11-23T01:00:00Z"]  # waiting from the start
    # nothing runs from 00:30 to 05:30: 02:00 to 05:00 are missed (01:00 was already enqueued)
    enqueue_due(engine, now=at("2026-11-23T05:30:00Z"))
    enqueue_due(engine, now=at("2026-11-23T05:31:00Z"))
    assert keys(raw, "h") == [f"h@2026-11-23T{hour:02d}:00:00Z" for hour in expected_hours]
    schedule = store.schedules.get(queue, "h", now=at("2026-11-23T05:31:00Z"))
    assert format_timestamp(schedule.last_enqueued) == "2026-11-23T06:00:00Z"
    assert [format_timestamp(t) for t in schedule.next_occurrences][:2] == [
        "2026-11-23T06:00:00Z",
        "2026-11-23T07:00:00Z",
    ]


def test_catch_up_all_is_capped(store: Store, engine: sa.Engine, raw: psycopg.Connection[Any], queue: str) -> None:
    spec = ScheduleSpec(cron="* * * * *", timezone="UTC", data={}, catch_up="all")
    store.schedules.put(queue, "m", spec, actor="ops", now=at("2026-11-23T00:00:30Z"))
    enqueue_due(engine, now=at("2026-11-25T00:00:30Z"))  # two days: 2,879 missed minutes
    found = keys(raw, "m")
    assert len(found) == 1 + MAX_CATCH_UP + 1
    assert found[0] == "m@2026-11-23T00:01:00Z"  # the one that was waiting
    assert found[-2:] == ["m@2026-11-25T00:00:00Z", "m@2026-11-25T00:01:00Z"]  # the latest, and the next


def test_a_cancelled_occurrence_is_skipped_not_enqueued_again(
    store: Store, engine: sa.Engine, raw: psycopg.Connection[Any], queue: str
) -> None:
    store.schedules.put(queue, "s", HOURLY, actor="ops", now=at("2026-11-23T00:30:00Z"))
    store.events.cancel(queue, "s@2026-11-23T01:00:00Z", actor="ops", reason="holiday")
    run_clock(engine, raw, at("2026-11-23T00:30:00Z"), at("2026-11-23T02:30:00Z"), timedelta(minutes=7))
    assert keys(raw, "s") == ["s@2026-11-23T01:00:00Z", "s@2026-11-23T02:00:00Z", "s@2026-11-23T03:00:00Z"]
    outcomes = raw.execute("SELECT outcome FROM tickler_event_all WHERE item_key LIKE 's@%' ORDER BY id").fetchall()
    assert [row[0] for row in outcomes] == ["cancelled", "delivered", None]


def test_a_paused_schedule_enqueues_nothing_and_resumes_from_then_on(
    store: Store, engine: sa.Engine, raw: psycopg.Connection[Any], queue: str
) -> None:
    store.schedules.put(queue, "p", HOURLY, actor="ops", now=at("2026-11-23T00:30:00Z"))
    paused = ScheduleSpec(cron=HOURLY.cron, timezone="UTC", data=HOURLY.data, catch_up="all", paused=True)
    store.schedules.put(queue, "p", paused, actor="ops", now=at("2026-11-23T00:40:00Z"))
    run_clock(engine, raw, at("2026-11-23T00:40:00Z"), at("2026-11-23T05:40:00Z"), timedelta(minutes=10))
    assert keys(raw, "p", open_only=True) == []
    resumed = ScheduleSpec(cron=HOURLY.cron, timezone="UTC", data=HOURLY.data, catch_up="all")
    store.schedules.put(queue, "p", resumed, actor="ops", now=at("2026-11-23T05:45:00Z"))
    # the paused hours are not caught up, even with catch_up "all"
    assert keys(raw, "p") == ["p@2026-11-23T01:00:00Z", "p@2026-11-23T06:00:00Z"]


def test_a_schedule_on_a_paused_queue_keeps_enqueueing(
    store: Store, engine: sa.Engine, raw: psycopg.Connection[Any], queue: str
) -> None:
    store.schedules.put(queue, "q", HOURLY, actor="ops", now=at("2026-11-23T00:30:00Z"))
    raw.execute("UPDATE tickler_queue SET paused = true WHERE name = %s", [queue])
    enqueue_due(engine, now=at("2026-11-23T01:00:00Z"))
    assert keys(raw, "q", open_only=True) == ["q@2026-11-23T01:00:00Z", "q@2026-11-23T02:00:00Z"]


def test_a_deleted_queue_takes_its_schedules_with_it(
    store: Store, engine: sa.Engine, raw: psycopg.Connection[Any], queue: str
) -> None:
    store.schedules.put(queue, "gone", HOURLY, actor="ops", now=at("2026-11-23T00:30:00Z"))
    raw.execute("DELETE FROM tickler_event WHERE queue = %s", [queue])
    raw.execute("DELETE FROM tickler_queue WHERE name = %s", [queue])
    assert raw.execute("SELECT count(*) FROM tickler_schedule").fetchone() == (0,)
    assert enqueue_due(engine, now=at("2026-11-23T05:00:00Z")) == 0


def test_deleting_a_schedule_leaves_occurrences_that_came_due(
    store: Store, engine: sa.Engine, raw: psycopg.Connection[Any], queue: str
) -> None:
    store.schedules.put(queue, "d", HOURLY, actor="ops", now=at("2026-11-23T00:30:00Z"))
    enqueue_due(engine, now=at("2026-11-23T01:00:05Z"))  # 01:00 came due, 02:00 waits
    store.schedules.delete(queue, "d", actor="ops", now=at("2026-11-23T01:00:10Z"))
    state = raw.execute("SELECT item_key, outcome FROM tickler_event_all ORDER BY schedule_on").fetchall()
    assert state == [("d@2026-11-23T01:00:00Z", None), ("d@2026-11-23T02:00:00Z", "cancelled")]
    assert enqueue_due(engine, now=at("2026-11-23T05:00:00Z")) == 0


def test_four_processes_enqueue_every_occurrence_exactly_once(
    store: Store, database_url: str, raw: psycopg.Connection[Any], queue: str
) -> None:
    start, end = at("2026-10-24T22:00:00Z"), at("2026-10-25T03:00:00Z")
    specs = {
        "five": ScheduleSpec(cron="*/5 * * * *", timezone="UTC", data={}, catch_up="all"),
        "half": ScheduleSpec(cron="*/30 * * * *", timezone="Europe/Berlin", data={}, catch_up="all"),
        "night": ScheduleSpec(cron="0 2 * * *", timezone="Europe/Berlin", data={}, catch_up="all"),
        "weekday": ScheduleSpec(cron="15 4 * * 0", timezone="America/New_York", data={}, catch_up="all"),
    }
    # many schedules due at the same instants, so that the processes contend for the same rows
    specs.update(
        {f"minutely{n}": ScheduleSpec(cron="* * * * *", timezone="UTC", data={}, catch_up="all") for n in range(8)}
    )
    for key, spec in specs.items():
        store.schedules.put(queue, key, spec, actor="ops", now=start)
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.workers.recurring_clock",
                database_url,
                format_timestamp(start) or "",
                format_timestamp(end) or "",
                str(step),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for step in (60, 60, 60, 97)  # different paces: one process runs ahead of the others
    ]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        outputs = [process.communicate(timeout=300)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert all(process.returncode == 0 for process in processes), outputs
    # A process skips a schedule another one holds (SKIP LOCKED) and leaves it to the next run;
    # the simulated clocks stop at `end`, so one last run at `end` stands for the time that goes on.
    last_run = enqueue_due(store.engine, now=end)
    enqueued = [row[0] for row in raw.execute("SELECT item_key FROM tickler_event_all").fetchall()]
    duplicates = {key: n for key, n in Counter(enqueued).items() if n > 1}
    assert duplicates == {}
    for key, spec in specs.items():
        expected = []
        for occurrence in cron.parse(spec.cron, spec.timezone).after(start):
            expected.append(f"{key}@{format_timestamp(occurrence)}")
            if occurrence > end:
                break  # the next one, waiting
        assert sorted(k for k in enqueued if k.startswith(key + "@")) == expected
    # each PUT enqueued its first occurrence; the processes all the others
    assert sum(int(output.strip()) for output in outputs) + last_run == len(enqueued) - len(specs)


def test_every_dispatcher_enqueues_due_occurrences(
    store: Store, database_url: str, raw: psycopg.Connection[Any], queue: str
) -> None:
    """A worker with no handlers at all still keeps the schedules going (real clock)."""
    # Created "yesterday": its waiting occurrence came due long ago, and the next is owed.
    yesterday = datetime.now(UTC) - timedelta(days=1)
    store.schedules.put(queue, "owed", HOURLY, actor="ops", now=yesterday)
    assert len(keys(raw, "owed")) == 1
    worker = Worker(settings=Settings(database_url=database_url, migrate_on_start=False, pool_size=2), name="w")
    worker.start()
    try:
        # catch_up "latest": the most recent missed hour, and the next one waiting
        wait_until(lambda: len(keys(raw, "owed")) == 3, timeout=30, what=lambda: str(keys(raw, "owed")))
    finally:
        worker.stop()
