"""Small LTD policy networks for the tests: random MLPs whose decisions vary with the tree."""

from __future__ import annotations

import torch

from specpilot.policies.ltd_net import LtdNets, LtdShape, mlp


def tiny_nets(shape: LtdShape, seed: int = 0, depth: bool = True, size: bool = True) -> LtdNets:
    """Random actors with a small hidden layer; the depth net's CONTINUE logit rises with the
    latest scores (a confident frontier keeps growing) so both decisions occur."""
    torch.manual_seed(seed)
    nets = LtdNets(shape, target="tiny")
    if depth:
        net = mlp(shape.depth_features, (8,), 2)
        with torch.no_grad():
            scores = shape.topk * shape.topk
            net[0].weight[0].zero_()
            net[0].weight[0, :scores] = 1.0 / scores
            net[0].bias[0] = 10.0  # ReLU(10 + mean score): positive unless the scores are low
            net[2].weight.zero_()
            net[2].bias.zero_()
            net[2].weight[1, 0] = 1.0
            net[2].bias[1] = -7.5  # CONTINUE while the mean latest score is above -2.5
        nets.depth = net.eval()
    if size:
        nets.size = mlp(shape.size_features, (16,), shape.size_actions).eval()
    return nets
