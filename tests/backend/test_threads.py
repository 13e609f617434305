"""A rank's torch threads: one, as torchrun gives, unless the user chose (nbdist.backend.threads)."""

from __future__ import annotations

import pytest

from nbdist.backend import threads


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, 1),
    ({"OMP_NUM_THREADS": ""}, 1),  # set empty is not a choice
    ({"OMP_NUM_THREADS": "4"}, None),
    ({"OMP_NUM_THREADS": "1"}, None),  # torchrun's own, passed on
])
def test_a_rank_takes_one_thread_unless_omp_num_threads_was_set(environ, expected):
    assert threads.plan(environ) == expected
