"""Latency predictors L(n_in, n_out): one strategy per file behind :class:`LatencyPredictor`."""
