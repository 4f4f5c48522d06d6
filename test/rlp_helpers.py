"""Shared by the RLP tests: a small labelled set with a relation a predictor can learn."""

from timebill_ros.training.dataset import Example


def planted(n, split):
    """Return ``n`` Examples: short answers for yes/no checks, long for 'in detail'."""
    out = []
    for i in range(n):
        short = i % 2 == 0
        text = (f'Is box {i} on shelf {i % 7}? Answer yes or no.' if short
                else f'Explain in detail how robot {i} plans a route through hall {i % 5}.')
        out.append(Example(f'{split}-{i}', 'x', split, text, 5 if short else 60, False, 20, 64))
    return out
