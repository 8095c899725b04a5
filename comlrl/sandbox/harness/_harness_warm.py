"""A rehearsal in the zygote before it forks its first run (inside; standard library only).

CPython 3.11 rewrites bytecode in place as it runs it (warm-up counters, then specialised
instructions). Run for the first time in a forked process, the judge's and the candidate's code is
rewritten there: in every process of every run, each rewrite also copying the page it is on. So
the zygote first runs a few small jobs of its own through the real judge and candidate code (the
candidate on a short-lived thread, over a socket pair). Runs then start with that code ready.

The rehearsal's program and tests are constants of this module, never a task's. Nothing of it stays
behind: the judge's link, the tests' module entry and the SIGALRM handler are put back, its thread
is gone and its objects are collected before the zygote forks anything.
"""

from __future__ import annotations

import _thread
import gc
import os
import signal
import socket
import sys
import time
import types

import _harness_candidate as hc
import _harness_judge as hj
import _harness_remote as hr
import _harness_tests as ht

PROGRAM = """
import math
from collections import Counter, defaultdict

LIMIT = 10
WORDS = ["a", "b"]


def add(a, b):
    return a + b


def split_words(text):
    return text.split()


def summary(xs):
    return {"n": len(xs), "max": max(xs), "distinct": set(xs), "pairs": [(x, x * x) for x in xs]}


def ratio(a, b):
    return a / b


def counts(xs):
    found = defaultdict(int)
    for x in xs:
        found[x] += 1
    return dict(found), Counter(xs).most_common(1)


def fill(xs):
    xs.append(len(xs))


class Box:
    def __init__(self, value):
        self.value = value
        self.items = []

    def get(self):
        return self.value

    def put(self, item):
        self.items.append(item)
        return len(self.items)
"""
ASSERTS = [
    "assert add(1, 2) == 3",
    "assert add('a', 'b') == 'ab'",
    "assert split_words('a b c') == ['a', 'b', 'c']",
    "assert summary([3, 1, 3])['n'] == 3 and summary([1])['distinct'] == {1}",
    "assert math.isclose(ratio(1, 4), 0.25)",
    "assert counts([1, 1, 2]) == ({1: 2, 2: 1}, [(1, 2)])",
    "xs = [1]; fill(xs); assert xs == [1, 1]",
    "b = Box(4); assert b.get() == 4 and b.put(5) == 1 and b.items == [5] and b.value == 4",
    "assert LIMIT == 10 and WORDS == ['a', 'b'] and abs(-2) == 2",
    "assert add(1, 1) == 3",
    "assert ratio(1, 0) == 0",
]
UNITTESTS = """
import unittest


class TestBox(unittest.TestCase):
    def setUp(self):
        self.box = Box(3)

    def test_get(self):
        self.assertEqual(self.box.get(), 3)

    def test_put(self):
        self.assertEqual(self.box.put("x"), 1)
        self.assertEqual(self.box.items, ["x"])

    def test_ratio(self):
        self.assertAlmostEqual(ratio(1, 3), 0.3333333, places=5)
        with self.assertRaises(ZeroDivisionError):
            ratio(1, 0)

    def test_wrong(self):
        self.assertEqual(add(2, 2), 5)
"""
ROUNDS = 10  # more than CPython's warm-up delay (8 calls), with room for specialisation


def rehearse(cfg: dict, rounds: int = ROUNDS) -> None:
    """Run the rehearsal jobs ``rounds`` times each (see the module's text)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    handler = signal.getsignal(signal.SIGALRM)
    stack = _thread.stack_size(1 << 20)  # the thread's stack stays mapped (cached) in the zygote
    try:
        for _ in range(rounds):
            _one(cfg, devnull, {"tests": ASSERTS, "kind": "asserts"})
            _one(cfg, devnull, {"tests": UNITTESTS, "kind": "unittest"})
    finally:
        _thread.stack_size(stack)
        for _ in range(1000):  # the threads have returned; let them finish exiting before any fork
            if _thread._count() == 0:
                break
            time.sleep(0.001)
        time.sleep(0.005)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        hr.LINK = None
        sys.modules.pop(ht.TESTS_MODULE, None)
        os.close(devnull)
        gc.collect()


def _one(cfg: dict, devnull: int, job: dict) -> None:
    judge_end, candidate_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    finished = _thread.allocate_lock()
    finished.acquire()

    def candidate() -> None:
        try:
            namespace = types.ModuleType(ht.PROGRAM_MODULE).__dict__
            server = hc.Server(candidate_end.fileno(), namespace)
            if ht.load_source(PROGRAM, "<program>", namespace) is None:
                server.reply(["loaded", "ok", "", server.listing()])
                server.serve()  # until the judge closes its end
        finally:
            candidate_end.close()
            finished.release()

    _thread.start_new_thread(candidate, ())
    emit = ht.make_emitter(devnull, "0" * 32)
    emit("hello", isolation={"mode": "ns-root", "netns": True, "uid": 0, "view": "minimal", "verdict": "split"})
    link = hr.LINK = hj.Link(cfg, None, emit, judge_end.detach())  # type: ignore[arg-type]
    job = dict(job, setup="", per_test_timeout=30.0, allow_shadowing=[])
    try:
        hj.run(cfg, job, emit, link)
    finally:
        link.close()
        finished.acquire()
