"""plotting.drawn_spread, FigureSlots and DrawnAside: what forked children draw is what drawing it here gives, in
order; the jobs are shared between this process and the children; a job that fails or a child that dies
leaves the drawing (and its error) to this process; on one core everything is drawn here."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from refusalbench.tasks.core.plotting import DrawnAside, FigureSlots, drawn_spread

TWO_CORES = sys.platform.startswith("linux") and len(os.sched_getaffinity(0)) >= 2


def _square(value: int) -> int:
    return value * value


def _squared_text(value: int) -> str:
    return str(value * value)


def _pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def _fails(message: str) -> str:
    raise ValueError(message)


def _dies_in_a_child(parent: int) -> str:
    time.sleep(0.05)
    if os.getpid() != parent:
        os._exit(3)  # a child killed mid-figure: no answer at all
    return "drawn here"


def test_results_come_back_in_order():
    assert drawn_spread([(_square, (3,)), (_square, (4,)), (_square, (5,))], costs=[1, 3, 2]) == [9, 16, 25]
    assert drawn_spread([]) == []


def test_the_jobs_are_shared_with_another_process_where_there_are_two_cores():
    pids = drawn_spread([(_pid_after, (0.3,))] * 4)
    assert (len(set(pids)) > 1) == TWO_CORES
    assert os.getpid() in pids or not TWO_CORES  # this process draws its share too


def test_a_failing_job_leaves_the_drawing_and_its_error_here():
    with pytest.raises(ValueError, match="no figure"):
        drawn_spread([(_pid_after, (0.2,)), (_fails, ("no figure",)), (_pid_after, (0.2,))])


def test_a_child_that_dies_leaves_its_jobs_to_this_process():
    assert drawn_spread([(_dies_in_a_child, (os.getpid(),))] * 4) == ["drawn here"] * 4


def test_on_one_core_everything_is_drawn_here():
    script = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from refusalbench.tasks.core.plotting import drawn_spread; "
        "print(set(drawn_spread([(os.getpid, ())] * 3)) == {os.getpid()})"
    )
    if not sys.platform.startswith("linux"):
        pytest.skip("sched_setaffinity: Linux only")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "True"


def test_slots_put_each_figure_in_its_placeholder():
    slots = FigureSlots()
    page = f"<p>{slots.add(str, 'a')}</p><p>{slots.add(_squared_text, 3, cost=5)}</p>{slots.add(str, 'b')}"
    assert slots.fill(page) == "<p>a</p><p>9</p>b"
    assert FigureSlots().fill("<p>no figure</p>") == "<p>no figure</p>"


def test_drawn_aside_is_drawn_by_a_child_while_this_process_goes_on():
    started = time.monotonic()
    aside = DrawnAside(_pid_after, 0.5)
    assert time.monotonic() - started < 0.4  # not waited for here
    pid = aside.result()
    assert (pid != os.getpid()) == TWO_CORES
    assert aside.result() == pid  # asked again: the same answer, not a second drawing


def test_drawn_aside_by_a_child_that_dies_or_fails_is_drawn_here():
    assert DrawnAside(_dies_in_a_child, os.getpid()).result() == "drawn here"
    with pytest.raises(ValueError, match="no figure"):
        DrawnAside(_fails, "no figure").result()


def test_a_drawing_aside_never_asked_for_stops_its_child():
    aside = DrawnAside(_pid_after, 30.0)
    child = aside._child
    if child is None:
        pytest.skip("one core: nothing drawn aside")
    del aside
    child.join(timeout=10)
    assert not child.is_alive()
