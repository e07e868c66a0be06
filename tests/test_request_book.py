"""A router shard's requests from receipt to reply (router/book.py), with no socket: replies
are collected from the book's `reply` callable; instances are announced to the dispatcher as
their READY would; the tokenizer is the bundled model's, for real."""

import time

import pytest

from numaserve.backends.tokenizer import Tokenizer
from numaserve.config.schema import PoolConfig
from numaserve.router.book import RequestBook
from numaserve.router.cache import ResultCache
from numaserve.router.dispatch import Dispatcher
from numaserve.router.metrics import RouterMetrics
from numaserve.status.report import Ready
from numaserve.tasks.prompts import NO_PROMPTS, Prompts
from numaserve.tasks.requests import Request
from numaserve.wire import protocol
from numaserve.wire.protocol import ErrorCode

POOLS = [PoolConfig(name="short", max_tokens=32), PoolConfig(name="long", max_tokens=128)]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer("bundled:minilm", max_length=128)


class Shard:
    """A book and what it answered: (envelope, reply body) in order."""

    def __init__(
        self,
        tokenizer,
        task="embed",
        queue_size=4,
        hold_until=0.0,
        max_windows=1,
        backlog=2048,
        max_batch=1,
        max_batch_tokens=None,
        prompts=NO_PROMPTS,
    ):
        self.replies: list[tuple[list[bytes], dict]] = []
        self.dispatch = Dispatcher(
            POOLS, queue_size=queue_size, max_batch=max_batch, max_batch_tokens=max_batch_tokens
        )
        self.book = RequestBook(
            tokenizer,
            self.dispatch,
            ResultCache(100),
            RouterMetrics([p.name for p in POOLS]),
            "model-a",
            lambda envelope, body: self.replies.append((envelope, body)),
            task=task,
            max_queue_ms=1000,
            hold_until=hold_until,
            max_windows=max_windows,
            max_backlog=backlog,
            prompts=prompts,
        )

    def instance(self, name="w0", pool="short", model_key="model-a") -> bytes:
        identity = name.encode()
        ready = Ready(name, pool, pid=1, model_key=model_key)
        self.dispatch.worker_ready(identity, ready, time.monotonic())
        self.book.instances_changed()
        return identity

    def ask(self, *texts, op="embed", request_id=1, deadline_ms=None, bulk=False, **options):
        request = Request(request_id, op, tuple(texts), deadline_ms, options=options, bulk=bulk)
        self.book.start([b"client"], request)
        return request

    def run_jobs(self, results=None, error=None, rounds=100, pass_s=0.001):
        """Every job answered as an instance would, until none is left to schedule (or
        `rounds` rounds); the jobs' texts, in the order they ran."""
        ran = []
        for _ in range(rounds):
            if self.book.feeding:  # as the loop does before it schedules
                self.book.feed(time.monotonic())
            jobs = self.dispatch.schedule(time.monotonic())
            if not jobs:
                return ran
            for job in jobs:
                ran += [(i.owner.request.id, i.index) for i in job.items]
                body = {"type": protocol.RESULT, "job": job.id, "pass_s": pass_s}
                if error is not None:
                    body["error"] = error
                else:
                    body["results"] = results or [{"score": float(len(i.ids))} for i in job.items]
                self.book.on_result(body, time.monotonic())
        if rounds == 100:
            raise AssertionError("jobs kept coming")
        return ran

    def codes(self) -> list[str]:
        return [body["error"]["code"] if "error" in body else "ok" for _, body in self.replies]


def test_a_request_is_answered_once_its_instance_returns_every_result(tokenizer):
    shard = Shard(tokenizer)
    shard.instance()
    shard.ask("hello world")
    assert shard.replies == [] and len(shard.book.active) == 1
    shard.run_jobs()
    [(envelope, body)] = shard.replies
    assert envelope == [b"client"] and body["id"] == 1
    assert body["results"][0]["tokens"] == 4 and body["results"][0]["truncated"] is False
    assert not shard.book.active


def test_a_request_that_asks_for_timings_is_told_where_its_time_went(tokenizer):
    shard = Shard(tokenizer)
    shard.instance()
    shard.book.start([b"client"], Request(1, "embed", ("hello world",), timings=True))
    shard.ask("another text", request_id=2)  # asks for none
    shard.run_jobs(pass_s=0.004)
    timings = shard.replies[0][1]["timings"]
    assert timings["inference_ms"] == 4.0  # its forward pass, as the instance said
    assert 0 <= timings["tokenize_ms"] <= timings["total_ms"]
    assert set(timings) == {"tokenize_ms", "queue_ms", "inference_ms", "total_ms"}
    assert "timings" not in shard.replies[1][1]


def test_a_repeated_text_is_answered_from_the_cache_without_reaching_a_pool(tokenizer):
    shard = Shard(tokenizer)
    shard.instance()
    shard.ask("hello world")
    shard.run_jobs()
    shard.ask("hello world", request_id=2)
    assert shard.codes() == ["ok", "ok"]
    assert all(not pool.queue for pool in shard.dispatch.pools)
    assert shard.replies[1][1]["results"] == shard.replies[0][1]["results"]


def test_results_are_cached_under_the_model_that_computed_them(tokenizer):
    shard = Shard(tokenizer)
    old = shard.instance("old", model_key="model-a")
    shard.ask("hello world")
    shard.run_jobs()
    shard.dispatch.remove_worker(old)
    shard.instance("new", model_key="model-b")  # a reload changed the model
    shard.ask("hello world", request_id=2)
    assert len(shard.replies) == 1, "answered from the old model's cache entry"
    assert sum(len(pool.queue) for pool in shard.dispatch.pools) == 1


def test_a_request_whose_first_piece_does_not_fit_the_queue_is_refused_whole(tokenizer):
    shard = Shard(tokenizer, queue_size=2)
    shard.instance()
    shard.ask("one", "two", request_id=1)  # two queued, the instance idle: room for one more
    shard.ask("three", "four", "five", request_id=2)  # its first piece: two texts
    assert shard.codes() == ["overloaded"]
    assert [len(pool.queue) for pool in shard.dispatch.pools] == [2, 0]


def test_a_big_request_is_queued_a_piece_at_a_time_and_answered_whole_in_order(tokenizer):
    shard = Shard(tokenizer, queue_size=4)
    shard.instance()
    texts = [f"text number {i}" for i in range(10)]
    shard.ask(*texts)
    piece = shard.dispatch.piece()  # two batches of one for the one instance
    assert piece == 2 and len(shard.dispatch.pools[0].queue) == piece
    shard.run_jobs()
    [(_, body)] = shard.replies
    scores = [r["score"] for r in body["results"]]
    assert scores == [float(len(e.ids)) for e in shard.book.tokenizer.encode(texts)]
    assert not shard.book.feeding and not shard.book.active


def test_a_query_behind_a_big_request_waits_for_one_piece_not_the_whole_request(tokenizer):
    shard = Shard(tokenizer, queue_size=64)
    shard.instance()
    shard.ask(*[f"bulk text {i}" for i in range(40)], request_id=1)
    shard.ask("a query", request_id=2)
    ran = shard.run_jobs()
    assert ran.index((2, 0)) == shard.dispatch.piece()  # after the first piece, not the 40
    assert shard.codes() == ["ok", "ok"]
    assert [body["id"] for _, body in shard.replies] == [2, 1]


def test_a_big_request_starved_of_room_is_answered_overloaded_after_max_queue_ms(tokenizer):
    shard = Shard(tokenizer, queue_size=2)
    shard.instance()
    shard.ask(*[f"bulk text {i}" for i in range(10)], request_id=1)  # its first piece: two

    def finish(job):
        body = {"type": protocol.RESULT, "job": job.id, "results": [{"score": 1.0}]}
        shard.book.on_result(body, time.monotonic())

    for other in (2, 3):  # each of its two texts runs, and another's queue behind it
        [job] = shard.dispatch.schedule(time.monotonic())
        finish(job)
        shard.ask(f"query {other}", request_id=other)
    [_running] = shard.dispatch.schedule(time.monotonic())  # busy with another's text
    shard.ask("query 4", request_id=4)  # and the queue full of others'
    shard.book.feed(time.monotonic())
    assert shard.replies == [] and shard.book.feeding
    shard.book.expire(time.monotonic() + 1.0)  # max_queue_ms: 1000
    [body] = [body for _, body in shard.replies if body["id"] == 1]
    assert body["error"]["code"] == "overloaded"
    assert "waited server.max_queue_ms=1000 ms for room in the queue" in body["error"]["message"]
    assert not shard.book.feeding


def test_a_failed_piece_fails_the_request_naming_the_text(tokenizer):
    shard = Shard(tokenizer)
    shard.instance()
    shard.ask(*[f"text {i}" for i in range(6)])
    shard.run_jobs(rounds=1)
    shard.run_jobs(error={"code": "internal", "message": "the forward pass failed"})
    [(_, body)] = shard.replies
    assert body["error"] == {"code": "internal", "message": "text 1: the forward pass failed"}
    assert not shard.book.feeding and all(not pool.queue for pool in shard.dispatch.pools)


def test_a_cancelled_big_request_queues_no_more_of_its_texts(tokenizer):
    shard = Shard(tokenizer, queue_size=64)
    shard.instance()
    request = shard.ask(*[f"text {i}" for i in range(40)])
    shard.book.cancel([b"client"], request.id)
    assert shard.run_jobs() == []  # its queued piece is skipped, its backlog dropped
    assert shard.replies == [] and not shard.book.feeding


def test_texts_no_live_instance_can_take_fail_as_no_instance(tokenizer):
    shard = Shard(tokenizer)
    shard.ask("hello world")
    assert shard.codes() == ["no_instance"]


def test_a_router_just_started_holds_texts_for_instances_about_to_announce_themselves(tokenizer):
    shard = Shard(tokenizer, hold_until=time.monotonic() + 60)
    shard.ask("hello world")
    assert shard.replies == [] and len(shard.book.active) == 1
    shard.instance()
    shard.run_jobs()
    assert shard.codes() == ["ok"]


def test_held_texts_fail_once_the_hold_is_over_and_no_instance_came(tokenizer):
    shard = Shard(tokenizer, hold_until=time.monotonic() + 60)
    shard.ask("hello world")
    shard.book.fail_unservable(time.monotonic() + 61)
    assert shard.codes() == ["no_instance"]


def test_a_stopping_instance_returns_its_texts_to_the_queue_for_another(tokenizer):
    shard = Shard(tokenizer)
    w0 = shard.instance("w0")
    shard.instance("w1")
    shard.ask("hello world")
    [job] = shard.dispatch.schedule(time.monotonic())
    assert job.worker == w0
    shard.dispatch.workers[w0].stopping = True  # its BYE came first
    error = {"code": "no_instance", "message": "stopping"}
    shard.book.on_result({"type": protocol.RESULT, "job": job.id, "error": error}, time.monotonic())
    assert shard.replies == []
    shard.run_jobs()
    assert shard.codes() == ["ok"]


def test_an_instance_error_fails_its_texts_with_that_code(tokenizer):
    shard = Shard(tokenizer)
    shard.instance()
    shard.ask("hello world")
    shard.run_jobs(error={"code": "too_long", "message": "no"})
    assert shard.codes() == ["too_long"]
    assert shard.replies[0][1]["error"]["message"] == "no"


def test_a_wrong_number_of_results_fails_the_request_as_internal(tokenizer):
    shard = Shard(tokenizer)
    shard.instance()
    shard.ask("hello world")
    shard.run_jobs(results=[{"score": 1.0}, {"score": 2.0}])
    assert shard.codes() == ["internal"]


def test_a_lost_instances_texts_are_retried_once_then_fail_as_internal(tokenizer):
    shard = Shard(tokenizer)
    shard.instance("w0")
    shard.instance("w1")
    shard.ask("hello world")
    for _ in range(2):
        shard.dispatch.schedule(time.monotonic())
        busy = next(w for w in shard.dispatch.workers.values() if w.jobs)
        busy.last_seen = -100.0  # silent
        shard.book.drop_silent(time.monotonic(), expiry=1.0, liveness=3)
        if not shard.dispatch.workers:
            break
    assert shard.codes() == ["internal"]


def test_a_request_past_its_deadline_is_answered_deadline_exceeded(tokenizer):
    shard = Shard(tokenizer)
    shard.instance()
    shard.ask("hello world", deadline_ms=10)
    shard.book.expire(time.monotonic() + 1)
    assert shard.codes() == ["deadline_exceeded"]
    shard.run_jobs()  # its result, when it comes, answers nothing more
    assert shard.codes() == ["deadline_exceeded"]


def test_a_text_queued_past_max_queue_ms_is_answered_overloaded(tokenizer):
    shard = Shard(tokenizer)
    shard.instance()
    shard.ask("first")
    shard.dispatch.schedule(time.monotonic())  # the only instance is busy
    shard.ask("second", request_id=2)
    shard.dispatch.max_queue_wait = 0.0
    shard.book.expire(time.monotonic() + 0.01)
    assert shard.codes() == ["overloaded"]
    assert "server.max_queue_ms=1000 ms" in shard.replies[0][1]["error"]["message"]


def test_no_instance_goes_to_a_peer_shard_where_one_can_take_it(tokenizer):
    shard = Shard(tokenizer)
    taken = []
    shard.book.hand_over = lambda pending: taken.append(pending.request.id) or True
    shard.ask("hello world")
    assert taken == [1] and shard.replies == []
    assert shard.book.counters["handed_over"] == 1 and not shard.book.active


def test_at_the_drain_timeout_what_is_in_flight_is_answered_with_an_error(tokenizer):
    shard = Shard(tokenizer)
    shard.instance()
    shard.ask("hello world")
    shard.book.begin_drain(timeout_s=5.0)
    assert not shard.book.drain_timed_out(time.monotonic())
    assert shard.book.drain_timed_out(time.monotonic() + 6)
    assert shard.codes() == ["no_instance"] and not shard.book.active


def test_rerank_answers_the_best_documents_first(tokenizer):
    shard = Shard(tokenizer, task="rerank")
    shard.instance()
    shard.ask("a", "a longer document here", op="rerank", query="q", top_k=1)
    shard.run_jobs()  # each document scored by its token count
    [(_, body)] = shard.replies
    assert [r["index"] for r in body["results"]] == [1]


def test_every_error_is_counted_by_its_code(tokenizer):
    shard = Shard(tokenizer)
    shard.ask("hello world")
    shard.ask("hello again", request_id=2)
    assert shard.book.errors == {ErrorCode.NO_INSTANCE.value: 2}


def test_a_cancelled_request_is_never_answered_and_its_queued_texts_never_run(tokenizer):
    shard = Shard(tokenizer)
    busy = shard.instance()
    shard.dispatch.schedule(time.monotonic())  # nothing queued yet: the instance stays idle
    shard.ask("first text", request_id=1)
    shard.ask("second text", request_id=2)
    shard.book.cancel([b"someone else"], 2)  # another client's id 2: not this one
    assert len(shard.book.active) == 2
    shard.book.cancel([b"client"], 2)

    ran = []
    for _ in range(10):
        for job in shard.dispatch.schedule(time.monotonic()):
            ran += [item.owner.request.id for item in job.items]
            body = {"type": protocol.RESULT, "job": job.id, "results": [{"embedding": b""}]}
            shard.book.on_result(body, time.monotonic())
    assert busy and ran == [1]
    assert [body["id"] for _, body in shard.replies] == [1]
    assert shard.book.counters["cancelled"] == 1 and not shard.book.active


def test_a_bulk_request_queued_first_runs_after_a_query_that_came_later(tokenizer):
    shard = Shard(tokenizer, queue_size=64)
    shard.instance()
    shard.ask(*[f"bulk text {i}" for i in range(4)], request_id=1, bulk=True)
    shard.ask("a query", request_id=2)
    ran = shard.run_jobs()
    assert ran[0] == (2, 0) and [body["id"] for _, body in shard.replies] == [2, 1]
    assert shard.book.metrics.replies == {
        ("embed", "ok", "bulk"): 1,
        ("embed", "ok", "interactive"): 1,
    }


def test_a_long_document_is_scored_in_windows_each_a_text_of_its_own(tokenizer):
    shard = Shard(tokenizer, task="rerank", queue_size=64, max_windows=8)
    shard.instance("w0", pool="long")
    document = " ".join(f"word{i}" for i in range(200))  # about 400 tokens: 128 a window
    shard.ask(document, "a short one", op="rerank", query="which word", top_k=None)
    ran = shard.run_jobs()
    [(_, body)] = shard.replies
    long, short = body["results"]
    assert long["chunks"] == sum(1 for r in ran if r[1] == 0) > 3 and not long["truncated"]
    assert long["score"] == 128.0  # the stand-in scores a window by its tokens: the best
    assert short["chunks"] == 1 and short["score"] == short["tokens"]


def test_each_window_of_a_long_text_begins_with_the_prompt_its_request_names(tokenizer):
    shard = Shard(tokenizer, queue_size=64, prompts=Prompts({"passage": "passage: "}))
    shard.instance("w0", pool="long")
    text = " ".join(f"word{i}" for i in range(200))  # about 400 tokens: 128 a window
    shard.ask(text, prompt_name="passage", max_chunks_per_doc=8)
    windows = [item.ids for pool in shard.dispatch.pools for item in pool.queue]
    prompt = tuple(tokenizer.encode(["passage: "])[0].ids[:-1])  # [CLS] passage :
    assert len(windows) >= 2 and all(w[: len(prompt)] == prompt for w in windows)


def test_a_long_documents_windows_are_queued_two_forward_passes_at_a_time(tokenizer):
    """A window fills a micro-batch of max_batch_tokens alone: queued all at once, the last
    of a document's windows would wait behind the others past max_queue_ms on one instance."""
    shard = Shard(
        tokenizer, task="rerank", queue_size=64, max_windows=8, max_batch=8, max_batch_tokens=128
    )
    shard.instance("w0", pool="long")
    document = " ".join(f"word{i}" for i in range(200))  # about 400 tokens: 128 a window
    shard.ask(document, op="rerank", query="which word", top_k=None)
    assert [len(pool.queue) for pool in shard.dispatch.pools] == [0, 2]
    ran = shard.run_jobs()
    [(_, body)] = shard.replies
    assert body["results"][0]["chunks"] == len(ran) > 3


def test_big_requests_past_the_backlog_limit_are_refused_whole_and_the_rest_served(tokenizer):
    shard = Shard(tokenizer, queue_size=64, backlog=30)
    shard.instance()
    shard.ask(*[f"first {i}" for i in range(20)], request_id=1)  # 2 queued, 18 held back
    shard.ask(*[f"second {i}" for i in range(20)], request_id=2)  # 18 more: past 30
    [(_, refused)] = shard.replies
    assert refused["id"] == 2 and refused["error"]["code"] == "overloaded"
    assert "18 texts of big requests wait here already, at most 30" in refused["error"]["message"]
    shard.run_jobs()
    assert shard.codes() == ["overloaded", "ok"] and shard.book.backlogged == 0
