"""Group commit: concurrent single-event writes of one process share one statement and one commit.

A request that is alone (no write of its key under way in this process, no other request on its
way to one) writes at once: a lone client pays no wait. Otherwise it joins the open group of its
key (queue, caller, on_conflict, ...), whose first request waits — at most `window` seconds — for
the write under way to finish and for the requests being handled to submit, then writes the whole
group in one call; each request takes its own result. Requests that arrive while a write is under
way are what fills a group: the database's time per call, not an artificial delay, gathers them.

When the group's write fails, nothing of it was written (one statement, one transaction), and
each of its items is written again alone, so an item the database refuses fails only its own
request. An error that says the database is away fails the group's requests alike: retrying them
one by one would only wait for it again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class _Group(Generic[Item, Result]):
    __slots__ = ("closed", "done", "errors", "items", "keys", "results")

    def __init__(self, item: Item, item_key: Hashable) -> None:
        self.items: list[Item] = [item]
        self.keys: set[Hashable] = {item_key}
        self.closed = False
        self.done = threading.Event()
        self.results: list[Result | None] = []
        self.errors: list[BaseException | None] = []


class GroupCommit(Generic[Item, Result]):
    """write(key, items) -> one result per item, in order; `shared(error)`: the error says the
    database is away (the group fails alike rather than item by item)."""

    def __init__(
        self,
        write: Callable[[Hashable, Sequence[Item]], Sequence[Result]],
        *,
        window: float = 0.0,
        shared: Callable[[BaseException], bool] = lambda error: False,
    ) -> None:
        self.write = write
        self.window = window
        self.shared = shared
        self._lock = threading.Condition(threading.Lock())
        self._open: dict[Hashable, _Group[Item, Result]] = {}
        self._handling = 0  # requests inside handling()
        self._submitted = 0  # of those, how many have submitted their item
        self._writing: dict[Hashable, int] = {}  # writes under way, by key

    def submitted(self) -> int:
        """How many of the requests being handled have submitted their item and wait for its write."""
        with self._lock:
            return self._submitted

    @contextlib.contextmanager
    def handling(self) -> Iterator[None]:
        """Around the whole handling of a request that may submit (from before its body is read):
        how the first of a group knows whether more requests are on their way."""
        with self._lock:
            self._handling += 1
        state = _Handling(self)
        _local.state = state
        try:
            yield
        finally:
            _local.state = None
            with self._lock:
                self._handling -= 1
                if state.submitted:
                    self._submitted -= 1
                self._lock.notify_all()  # a leader waiting for this one stops waiting

    def submit(self, key: Hashable, item_key: Hashable, item: Item) -> Result:
        """Write `item` (alone, or with the concurrent items of the same key); its result."""
        state: _Handling | None = getattr(_local, "state", None)
        if state is not None and state.owner is not self:
            state = None
        with self._lock:
            if state is not None and not state.submitted:
                state.submitted = True
                self._submitted += 1
            group = self._open.get(key)
            on_the_way = self._handling - self._submitted
            if self.window <= 0 or (group is None and not self._writing.get(key) and on_the_way <= 0):
                group = None
                leader = alone = True
            elif group is not None and not group.closed and item_key not in group.keys:
                group.items.append(item)
                group.keys.add(item_key)
                index, leader, alone = len(group.items) - 1, False, False
                self._lock.notify_all()
            elif group is None:
                group = self._open[key] = _Group(item, item_key)
                leader, alone = True, False
            else:  # the same key twice at once: this one goes alone, after nothing
                group, leader, alone = None, True, True
        if alone:
            self._started(key)
            try:
                return self.write(key, [item])[0]
            finally:
                self._finished(key)
        assert group is not None
        if not leader:
            group.done.wait()
            error = group.errors[index]
            if error is not None:
                raise error
            result = group.results[index]
            assert result is not None
            return result
        self._gather(key, group)
        try:
            self._run(key, group)
        finally:
            self._finished(key)
        if group.errors[0] is not None:
            raise group.errors[0]
        first = group.results[0]
        assert first is not None
        return first

    def _gather(self, key: Hashable, group: _Group[Item, Result]) -> None:
        deadline = time.monotonic() + self.window
        with self._lock:
            # Wait while a write of the key is under way or requests being handled have not
            # submitted yet (they may join), up to the window.
            while self._writing.get(key) or self._handling > self._submitted:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            group.closed = True
            if self._open.get(key) is group:
                del self._open[key]
            self._writing[key] = self._writing.get(key, 0) + 1

    def _started(self, key: Hashable) -> None:
        with self._lock:
            self._writing[key] = self._writing.get(key, 0) + 1

    def _finished(self, key: Hashable) -> None:
        with self._lock:
            left = self._writing[key] - 1
            if left:
                self._writing[key] = left
            else:
                del self._writing[key]
            self._lock.notify_all()  # a group waiting for this write goes now

    def _run(self, key: Hashable, group: _Group[Item, Result]) -> None:
        items = group.items
        try:
            try:
                group.results = list(self.write(key, items))
                group.errors = [None] * len(items)
            except Exception as error:
                if len(items) == 1 or self.shared(error):
                    group.results, group.errors = [None] * len(items), [error] * len(items)
                else:  # nothing was written: each alone, so that only what the database refuses fails
                    group.results, group.errors = [], []
                    for item in items:
                        try:
                            group.results.append(self.write(key, [item])[0])
                            group.errors.append(None)
                        except Exception as own:
                            group.results.append(None)
                            group.errors.append(own)
        finally:
            if len(group.errors) < len(items):  # interrupted (BaseException): no follower waits forever
                missing = len(items) - len(group.errors)
                group.results += [None] * missing
                group.errors += [RuntimeError("the group's write was interrupted")] * missing
            group.done.set()


class _Handling:
    __slots__ = ("owner", "submitted")

    def __init__(self, owner: object) -> None:
        self.owner = owner
        self.submitted = False


_local = threading.local()
