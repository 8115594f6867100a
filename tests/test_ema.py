"""The EMA of trainable weights: its update rule and the storage swap of ``swapped_in``."""

from __future__ import annotations

import torch
from torch import nn

from genrl.policies.ema import EMA


def test_ema_step_and_swap_restore_the_live_weights_exactly() -> None:
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    ema = EMA(net, decay=0.75)
    start = {n: p.detach().clone() for n, p in net.named_parameters()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    ema.step(0)  # shadow = 0.75 start + 0.25 (start + 1) = start + 0.25
    live = {n: p.detach().clone() for n, p in net.named_parameters()}
    weight = net.weight
    with ema.swapped_in():
        for n, p in net.named_parameters():
            assert torch.allclose(p, start[n] + 0.25)
        x = torch.ones(1, 3)
        assert torch.allclose(net(x), x @ (start["weight"] + 0.25).T + start["bias"] + 0.25)
    assert net.weight is weight  # the same Parameter object: optimizers and hooks keep working
    for n, p in net.named_parameters():
        assert torch.equal(p, live[n])
        assert torch.allclose(ema.shadow[n], start[n] + 0.25)
    # Training after a swap updates the live weights, not the shadow.
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    net(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    assert not torch.equal(net.weight, live["weight"])
    assert torch.allclose(ema.shadow["weight"], start["weight"] + 0.25)
