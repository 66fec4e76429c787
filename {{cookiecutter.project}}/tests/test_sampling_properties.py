"""The samplers on any layout: every image once per epoch less the documented leftovers, each run of records read by
one loader worker, and a resumed epoch on any number of processes that trains each image left once. Over a thousand
layouts drawn by Hypothesis; no process is started (tests/helpers/epochs.py)."""
from collections import Counter

import pytest

from {{ cookiecutter.package }}.data.coverage import Coverage
from {{ cookiecutter.package }}.data.order import BlockOrder, RandomOrder

from helpers.epochs import (agreed, assert_each_run_read_by_one_worker, assert_every_image_once, read_epoch,
                            records, stopped_and_resumed, trained_by_all)

pytestmark = pytest.mark.full  # 1,200 layouts, some 20 s: the fast tier has the samplers in test_order.py and test_sampling.py

pytest.importorskip("hypothesis", reason="the property tests need Hypothesis: pip install -e '.[dev]'")
from hypothesis import HealthCheck, given, settings  # noqa: E402 - after the skip above
from hypothesis import strategies as st  # noqa: E402

orders = st.one_of(st.just(RandomOrder()), st.builds(BlockOrder, block=st.integers(1, 70), window=st.integers(1, 6)))


@st.composite
def layouts(draw):
    processes = draw(st.integers(1, 64))
    return (draw(st.integers(0, 3000)), draw(st.integers(1, 64)),
            draw(st.lists(st.integers(0, 8), min_size=processes, max_size=processes)))


PROPERTY = settings(max_examples=600, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@PROPERTY
@given(layouts(), orders, st.integers(0, 2**31))
def test_every_image_is_read_once_and_every_run_by_one_worker_on_any_layout(shape, order, seed):
    """Processes with worker counts of their own, block and window sizes that divide nothing."""
    size, batch, workers = shape
    layout = agreed(size, workers, batch, order, seed)
    reads = read_epoch(size, layout, order, workers, seed)
    assert_every_image_once(reads, size)
    assert_each_run_read_by_one_worker(reads, order, size, layout)
    entry = Coverage(size).check(records(reads, trained_by_all(reads)), reads.traces[0], counts=None)
    assert entry["checked"] and entry["trained"] == sum(reads.trained.values())


@PROPERTY
@given(layouts(), orders, st.integers(0, 2**31), st.floats(0, 1), st.integers(1, 64),
       st.lists(st.integers(0, 8), min_size=64, max_size=64))
def test_a_resume_at_any_point_with_another_layout_trains_each_image_left_once(shape, order, seed, stop_at,
                                                                            processes, new_workers):
    size, batch, workers = shape
    began = agreed(size, workers, batch, order, seed)
    stopped = read_epoch(size, began, order, workers, seed, stop_after=int(stop_at * (size // len(workers) // batch)))
    done = sum(stopped.trained.values())  # as Run counts it: whole batches of every process
    new_workers = new_workers[:processes]
    layout = agreed(size, new_workers, batch, order, seed)
    resumed = read_epoch(size, layout, order, new_workers, seed, skip=done, began=began)
    assert_every_image_once(resumed, size, before=stopped.trained)
    assert Counter(int(index) for index in resumed.traces[0].plan.before()) == stopped.trained
    if layout == began:  # resumed as it began: the loader's turns start anew, so each lane moves whole to a worker
        assert_each_run_read_by_one_worker(resumed, order, size, layout)
    coverage = stopped_and_resumed(Coverage(size), stopped)
    entry = coverage.check(records(resumed, trained_by_all(resumed)), resumed.traces[0], counts=None)
    assert entry["trained_before_resume"] == done


