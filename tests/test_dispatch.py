"""When the public functions may skip the dispatcher (``strictops.ops._runtime.dispatch``)."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from strictops.meta.testing import fake_mode
from strictops.ops._runtime.dispatch import can_skip_dispatcher


def test_plain_tensors_in_plain_eager_skip_the_dispatcher():
    assert can_skip_dispatcher(torch.empty(3), torch.empty(2, dtype=torch.int32), None)


def test_anything_that_needs_the_dispatcher_keeps_it():
    t = torch.empty(3)
    with fake_mode():
        assert not can_skip_dispatcher(torch.empty(3))
    with TorchFunctionMode():
        assert not can_skip_dispatcher(t)
    assert not can_skip_dispatcher(torch.empty(3, requires_grad=True))
    with torch.no_grad():  # no autograd: the in-place rules do not apply
        assert can_skip_dispatcher(torch.empty(3, requires_grad=True))
    assert not can_skip_dispatcher(torch.nn.Parameter(torch.empty(3)))  # a subclass
    assert not torch.vmap(lambda x: torch.tensor(can_skip_dispatcher(x)))(torch.empty(2, 3)).any()
