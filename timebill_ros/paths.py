"""Where timebill_ros keeps what it makes: the per-user cache root (one home for it).

The converted embedded model, the timing calibrations, the online time-model state and the
length predictors' ONNX files all live under :func:`cache_root`.
"""

import os

CACHE_ENV = 'TIMEBILL_CACHE'
DEFAULT_CACHE_DIR = os.path.join('~', '.cache', 'timebill_ros')


def cache_root(cache_dir=None):
    """Return the cache directory: ``cache_dir``, else $TIMEBILL_CACHE, else the default.

    The default is ``~/.cache/timebill_ros``.
    """
    chosen = cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR
    return os.path.expanduser(chosen)
