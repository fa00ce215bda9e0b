"""plotting.drawn_aside: what a forked child draws is what drawing it here gives, in order; a failure
in the child leaves the drawing (and its error) to this process."""

from __future__ import annotations

import os
import sys

import pytest

from refusalbench.tasks.core.plotting import drawn_aside


def _square(value: int) -> int:
    return value * value


def _pid(_: int) -> int:
    return os.getpid()


def _fails(message: str) -> str:
    raise ValueError(message)


def test_results_come_back_in_order():
    assert drawn_aside([(_square, (3,)), (_square, (4,))])() == [9, 16]
    assert drawn_aside([])() == []


def test_the_jobs_run_in_another_process_where_there_are_two_cores():
    drawn = drawn_aside([(_pid, (0,))])()
    two_cores = sys.platform.startswith("linux") and len(os.sched_getaffinity(0)) >= 2
    assert (drawn[0] != os.getpid()) == two_cores


def test_a_failing_child_leaves_the_drawing_and_its_error_here():
    results = drawn_aside([(_fails, ("no figure",))])
    with pytest.raises(ValueError, match="no figure"):
        results()
