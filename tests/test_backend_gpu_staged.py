"""The ``zipccl`` backend on a GPU its ranks share: CUDA calls on the host-staged transport's
lanes, several in flight at once (zipccl._lanes), each result bit-exact, a mismatch raised by
``wait()`` on every rank (tests/_lane_scenarios.py). Run on a CUDA machine:
``python -m pytest -m gpu tests/test_backend_gpu_staged.py``.
"""

from __future__ import annotations

import pytest
import torch
from zipccl.settings import Settings

from tests import _lane_scenarios as lanes
from tests import test_backend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

pair = test_backend.pair  # the module-scoped cluster of 2 ranks on a zipccl default group


@pytest.mark.parametrize("mode", ["auto", "always"])
def test_buckets_in_flight_are_exact(pair, mode):
    for found in pair.run(lanes.sc_buckets_in_flight, "cuda", env={"ZIPCCL_MODE": mode}):
        assert found == {"lanes": Settings.lanes, "works": {"LaneWork"}, "exact": True}, found


@pytest.mark.parametrize("mode", ["auto", "always"])
def test_every_op_in_flight_is_exact(pair, mode):
    for found in pair.run(lanes.sc_every_op_in_flight, "cuda", env={"ZIPCCL_MODE": mode}):
        assert all(found.values()), found  # type: ignore[union-attr]


def test_gather_into_host_list_is_exact(pair):
    assert all(pair.run(lanes.sc_gather_into_host_list, "cuda", env=test_backend.ALWAYS))


def test_mismatch_on_a_lane_raises_on_every_rank(pair):
    for error, recovered in pair.run(lanes.sc_mismatch_on_a_lane, "cuda", env=test_backend.ALWAYS):
        assert lanes.MISMATCH in error, error
        assert recovered
