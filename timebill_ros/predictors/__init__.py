"""Response-length predictors (N^, Eq. 2)."""

from timebill_ros.predictors.base import LengthPredictor
from timebill_ros.predictors.fallback import FallbackPredictor


def make_predictor(predictor_config):
    """Build the predictor named by ``predictor_config.kind``."""
    if predictor_config.kind == 'fallback':
        return FallbackPredictor()
    raise ValueError(f'unknown predictor.kind {predictor_config.kind!r}')


__all__ = ['LengthPredictor', 'FallbackPredictor', 'make_predictor']
