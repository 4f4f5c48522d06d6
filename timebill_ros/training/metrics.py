"""Accuracy of response-length predictions: MAE, RMSE, R^2, within-tolerance share."""

import numpy as np

WITHIN_TOKENS = 32  # tolerance of the "within +-32 tokens" column, tokens


def length_metrics(y_true, y_pred, within: int = WITHIN_TOKENS) -> dict:
    """Return {'mae', 'rmse', 'r2', 'within'} of predicted vs true lengths (tokens).

    r2 is 1 - SS_res / SS_tot (negative when worse than predicting the mean).
    within is the share of predictions with |error| <= ``within`` tokens.
    """
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    if y_true.shape != y_pred.shape or y_true.ndim != 1 or y_true.size == 0:
        raise ValueError(f'need two equal-length non-empty 1-D arrays, got shapes '
                         f'{y_true.shape} and {y_pred.shape}')
    err = y_pred - y_true
    ss_tot = float(((y_true - y_true.mean()) ** 2).sum())
    r2 = 1.0 - float((err ** 2).sum()) / ss_tot if ss_tot > 0 else float('nan')
    return {'mae': float(np.abs(err).mean()), 'rmse': float(np.sqrt((err ** 2).mean())),
            'r2': r2, 'within': float((np.abs(err) <= within).mean())}


def wcet_coverage(y_true, n_w, n_max: int) -> dict:
    """Return how well a pessimistic length N^_W bounds the answers at a cap N_max.

    y_true: true lengths, tokens; n_w: N^_W per prompt, tokens (clipped to ``n_max`` here, as
    the server clips it); both 1-D of one length. Returns {'cover': share of answers (capped
    at ``n_max``) with length <= N^_W, 'mean_fraction': mean N^_W / N_max (1 = no better than
    budgeting every goal for N_max)}.
    """
    y_true = np.minimum(np.asarray(y_true, dtype=np.float64), n_max)
    n_w = np.minimum(np.asarray(n_w, dtype=np.float64), n_max)
    if y_true.shape != n_w.shape or y_true.ndim != 1 or y_true.size == 0 or n_max < 1:
        raise ValueError(f'need two equal-length non-empty 1-D arrays and n_max >= 1, got '
                         f'shapes {y_true.shape}, {n_w.shape} and n_max {n_max!r}')
    return {'cover': float((y_true <= n_w).mean()), 'mean_fraction': float(n_w.mean() / n_max)}
