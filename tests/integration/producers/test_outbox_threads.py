"""Outbox across threads: a put wakes a waiter; concurrent producers and a consumer lose
nothing they do not count."""

from __future__ import annotations

import threading

from support.publishing import entry, names

from producers.base.outbox import Entry, Outbox


def test_wait_wakes_when_another_thread_puts() -> None:
    box = Outbox(100)
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(box.wait(timeout=10.0)))
    waiter.start()
    box.put(entry(0))
    waiter.join(timeout=10.0)
    assert not waiter.is_alive()
    assert woke == [True]


def test_two_producers_and_one_consumer_lose_nothing_unaccounted() -> None:
    per_thread = 5000
    box = Outbox(40 * 10)  # 40 entries: small enough that producers overrun the consumer
    start = threading.Barrier(3)
    taken: list[Entry] = []
    producers_done = threading.Event()

    def produce(base: int) -> None:
        start.wait()
        for n in range(per_thread):
            box.put(entry(base + n))

    def consume() -> None:
        start.wait()
        while not producers_done.is_set() or len(box):
            batch = box.take(30)
            for e in batch:
                box.ack(e)
            taken.extend(batch)

    threads = [
        threading.Thread(target=produce, args=(0,)),
        threading.Thread(target=produce, args=(per_thread,)),
    ]
    consumer = threading.Thread(target=consume)
    for t in [*threads, consumer]:
        t.start()
    for t in threads:
        t.join(timeout=30)
    producers_done.set()
    consumer.join(timeout=30)
    assert not any(t.is_alive() for t in [*threads, consumer])

    got = names(taken)
    assert len(got) == len(set(got)), "an entry came out twice"
    assert len(got) + box.dropped == 2 * per_thread
    assert box.dropped_bytes == 10 * box.dropped
    assert box.size_bytes == 0
    # Each producer's own entries keep their order.
    first = [n for n in got if n < per_thread]
    second = [n for n in got if n >= per_thread]
    assert first == sorted(first)
    assert second == sorted(second)
