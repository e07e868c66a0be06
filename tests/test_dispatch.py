"""Dispatch rules, on the pure state machine: no sockets, time passed in."""

from dataclasses import dataclass

from numaserve.config.schema import PoolConfig
from numaserve.router.dispatch import MAX_PADDING, Dispatcher, Item
from numaserve.status.report import Ready
from numaserve.wire.protocol import ErrorCode

SHORT, LONG = 0, 1


@dataclass
class Request:
    done: bool = False


def dispatcher(**kw):
    pools = [PoolConfig("long", max_tokens=512), PoolConfig("short", max_tokens=32)]
    return Dispatcher(pools, queue_size=kw.pop("queue_size", 4), **kw)


def add_worker(d, name, pool, now=0.0):
    identity = name.encode()
    d.worker_ready(identity, Ready(name, pool, pid=1), now)
    return identity


def item(d, tokens, owner=None):
    return Item(owner or Request(), 0, tuple(range(tokens)), d.pool_for(tokens))


def test_pools_are_ordered_by_length_band():
    d = dispatcher()
    assert [p.config.name for p in d.pools] == ["short", "long"]


def test_a_text_goes_to_the_smallest_pool_that_fits():
    d = dispatcher()
    assert d.pool_for(1) == SHORT and d.pool_for(32) == SHORT
    assert d.pool_for(33) == LONG and d.pool_for(512) == LONG
    assert d.pool_for(513) is None


def test_short_text_runs_on_a_short_instance():
    d = dispatcher()
    add_worker(d, "short-0", "short")
    add_worker(d, "long-0", "long")
    assert d.admit([item(d, 10)], now=0) is None
    (job,) = d.schedule(now=0)
    assert job.worker == b"short-0"


def test_the_instance_idle_longest_gets_the_next_text():
    d = dispatcher()
    add_worker(d, "short-0", "short", now=0)
    add_worker(d, "short-1", "short", now=0)
    d.workers[b"short-0"].idle_since = 5
    d.workers[b"short-1"].idle_since = 3
    d.admit([item(d, 10)], now=6)
    assert [j.worker for j in d.schedule(now=6)] == [b"short-1"]


def test_a_busy_instance_takes_no_second_job():
    d = dispatcher()
    add_worker(d, "short-0", "short")
    d.admit([item(d, 10), item(d, 10)], now=0)
    assert len(d.schedule(now=0)) == 1
    assert d.schedule(now=0) == []
    assert len(d.pools[SHORT].queue) == 1


def test_short_text_spills_over_to_an_idle_long_instance():
    d = dispatcher()
    add_worker(d, "short-0", "short")
    add_worker(d, "long-0", "long")
    d.admit([item(d, 10), item(d, 10)], now=0)
    assert sorted(j.worker for j in d.schedule(now=0)) == [b"long-0", b"short-0"]


def test_no_spillover_while_the_texts_own_pool_has_an_idle_instance():
    d = dispatcher()
    add_worker(d, "long-0", "long", now=0)  # idle longest: first in line
    add_worker(d, "short-0", "short", now=5)
    d.admit([item(d, 10)], now=6)
    assert [j.worker for j in d.schedule(now=6)] == [b"short-0"]


def test_no_spillover_when_it_is_off():
    d = dispatcher(spillover=False)
    add_worker(d, "short-0", "short")
    add_worker(d, "long-0", "long")
    d.admit([item(d, 10), item(d, 10)], now=0)
    assert [j.worker for j in d.schedule(now=0)] == [b"short-0"]


def test_long_text_never_runs_on_a_short_instance():
    d = dispatcher()
    add_worker(d, "short-0", "short")
    add_worker(d, "long-0", "long")
    d.admit([item(d, 100), item(d, 100)], now=0)
    assert [j.worker for j in d.schedule(now=0)] == [b"long-0"]


def test_a_long_instance_serves_its_own_queue_before_spillover():
    d = dispatcher()
    add_worker(d, "long-0", "long")
    add_worker(d, "short-0", "short")
    d.workers[b"short-0"].jobs = 1  # busy
    d.admit([item(d, 10)], now=0)
    d.admit([item(d, 100)], now=1)
    (job,) = d.schedule(now=1)
    assert len(job.items[0].ids) == 100


def test_a_full_queue_refuses_the_request_whole():
    d = dispatcher(queue_size=2)
    add_worker(d, "short-0", "short")
    d.workers[b"short-0"].jobs = 1
    assert d.admit([item(d, 10), item(d, 10)], now=0) is None
    assert d.admit([item(d, 10)], now=0) is ErrorCode.OVERLOADED
    assert len(d.pools[SHORT].queue) == 2


def test_idle_instances_count_as_room():
    d = dispatcher(queue_size=1)
    add_worker(d, "short-0", "short")
    add_worker(d, "short-1", "short")
    assert d.admit([item(d, 10)] * 3, now=0) is None


def test_a_pool_without_instances_is_no_instance():
    d = dispatcher(spillover=False)
    add_worker(d, "long-0", "long")
    assert d.admit([item(d, 10)], now=0) is ErrorCode.NO_INSTANCE


def test_texts_of_a_dead_instance_are_retried_once_elsewhere():
    d = dispatcher()
    add_worker(d, "short-0", "short")
    add_worker(d, "short-1", "short")
    d.admit([item(d, 10)], now=0)
    (job,) = d.schedule(now=0)
    _, lost = d.remove_worker(job.worker)
    assert d.requeue(lost, count_attempt=True) == []
    (retry,) = d.schedule(now=1)
    assert retry.worker != job.worker
    _, lost = d.remove_worker(retry.worker)
    assert d.requeue(lost, count_attempt=True) == lost  # second failure: give up


def test_texts_are_not_retried_where_no_instance_is_left():
    d = dispatcher()
    add_worker(d, "short-0", "short")
    d.admit([item(d, 10)], now=0)
    (job,) = d.schedule(now=0)
    _, lost = d.remove_worker(job.worker)
    assert d.requeue(lost, count_attempt=True) == lost


def test_answered_requests_leave_the_queue():
    d = dispatcher()
    add_worker(d, "short-0", "short")
    d.workers[b"short-0"].jobs = 1
    gone, kept = Request(), Request()
    d.admit([item(d, 10, gone), item(d, 10, kept)], now=0)
    gone.done = True
    d.workers[b"short-0"].jobs = 0
    (job,) = d.schedule(now=1)
    assert job.items[0].owner is kept


def test_a_micro_batch_leaves_out_texts_of_answered_requests():
    d = dispatcher(max_batch=3, queue_size=10)
    add_worker(d, "long-0", "long")
    d.workers[b"long-0"].jobs = 1
    gone, kept = Request(), Request()
    d.admit([item(d, 100, kept), item(d, 101, gone), item(d, 102, kept)], now=0)
    gone.done = True
    d.workers[b"long-0"].jobs = 0
    (job,) = d.schedule(now=0)
    assert [len(i.ids) for i in job.items] == [100, 102]


def test_micro_batch_takes_texts_of_similar_length():
    d = dispatcher(max_batch=3, queue_size=10)
    add_worker(d, "long-0", "long")
    d.workers[b"long-0"].jobs = 1
    d.admit([item(d, n) for n in (100, 400, 110, 390, 105)], now=0)
    d.workers[b"long-0"].jobs = 0
    (job,) = d.schedule(now=0)
    assert [len(i.ids) for i in job.items] == [100, 105, 110]


def test_a_micro_batch_takes_only_its_instances_share_of_the_queue():
    """Six queued texts and two instances: the first one free takes three, not all six
    (the other, about to be free, would idle while one batch ran six)."""
    d = dispatcher(max_batch=8, queue_size=10)
    for name in ("long-0", "long-1"):
        add_worker(d, name, "long")
        d.workers[name.encode()].jobs = 1
    d.admit([item(d, 100) for _ in range(6)], now=0)
    d.workers[b"long-0"].jobs = 0
    (job,) = d.schedule(now=0)
    assert len(job.items) == 3


def test_a_micro_batch_leaves_out_a_text_that_would_pad_it_past_max_padding():
    d = dispatcher(max_batch=8, queue_size=10)
    add_worker(d, "long-0", "long")
    d.workers[b"long-0"].jobs = 1
    d.admit([item(d, n) for n in (100, 200, 104)], now=0)
    d.workers[b"long-0"].jobs = 0
    (job,) = d.schedule(now=0)
    assert [len(i.ids) for i in job.items] == [100, 104]  # 3 x 200 > 1.25 x 404 tokens
    assert MAX_PADDING == 1.25


def test_micro_batch_waits_up_to_max_wait_for_company():
    d = dispatcher(max_batch=4, max_wait=0.005)
    add_worker(d, "short-0", "short")
    d.admit([item(d, 10)], now=0)
    assert d.schedule(now=0.001) == []
    assert d.next_wakeup(now=0.001) == 0.005
    assert len(d.schedule(now=0.006)) == 1


def test_silent_instances_are_found():
    d = dispatcher()
    add_worker(d, "short-0", "short", now=0)
    add_worker(d, "short-1", "short", now=0)
    d.worker_seen(b"short-1", now=2)
    assert d.silent_workers(now=2.5, timeout=1.5) == [b"short-0"]


def test_a_stopping_instance_gets_no_work():
    d = dispatcher()
    add_worker(d, "short-0", "short")
    d.workers[b"short-0"].stopping = True
    assert d.admit([item(d, 10)], now=0) is ErrorCode.NO_INSTANCE


# -- priorities -----------------------------------------------------------------------------


def bulk_item(d, tokens, owner=None):
    text = item(d, tokens, owner)
    text.bulk = True
    return text


def run_one_by_one(d, batches: int) -> list[bool]:
    """Which priority each of `batches` batches on one instance came from (True: bulk)."""
    taken = []
    for i in range(batches):
        (job,) = d.schedule(now=i)
        taken += [job.items[0].bulk]
        d.finish(job.id, now=i)
    return taken


def test_an_interactive_text_runs_before_bulk_texts_queued_earlier():
    d = dispatcher(queue_size=16)
    add_worker(d, "short-0", "short")
    assert d.admit([bulk_item(d, 10) for _ in range(5)], now=0) is None
    assert d.admit([item(d, 10)], now=1) is None
    assert run_one_by_one(d, 2) == [False, True]


def test_bulk_gets_every_eighth_batch_while_interactive_texts_keep_waiting():
    d = dispatcher(queue_size=64)
    add_worker(d, "short-0", "short")
    d.admit([bulk_item(d, 10) for _ in range(4)], now=0)
    d.admit([item(d, 10) for _ in range(30)], now=0)
    assert run_one_by_one(d, 16) == ([False] * 7 + [True]) * 2


def test_bulk_is_shed_when_its_own_queue_is_full_and_interactive_still_gets_in():
    d = dispatcher(queue_size=4)
    add_worker(d, "short-0", "short")
    d.schedule(now=0)  # nothing yet: the instance stays idle
    assert d.admit([bulk_item(d, 10) for _ in range(5)], now=0) is None  # 4 queued + the idle one
    assert d.admit([bulk_item(d, 10)], now=0) is ErrorCode.OVERLOADED
    assert d.admit([item(d, 10) for _ in range(4)], now=0) is None


def test_the_instances_undelivered_spans_only_grow_as_instances_come_and_go():
    d = dispatcher()
    a, b = add_worker(d, "a", "short"), add_worker(d, "b", "long")
    d.workers[a].spans_dropped, d.workers[b].spans_dropped = 5, 3
    d.remove_worker(a)  # a restarted instance starts counting from 0 again
    add_worker(d, "a2", "short")
    assert d.spans_dropped() == 8
