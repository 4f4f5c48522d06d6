"""Backends: where goals run (``engine.backend``), one per module.

``local``: the model runs in this process (backends/local.py). ``openai``: an existing
engine serves it over its OpenAI-compatible HTTP API (backends/openai.py, over the remote
pipeline of backends/remote.py). A new backend is its file plus its name in
``plugins.NAMES['backend']``; a new remote API is a WireFormat and a RemoteBackend in its file.
"""

from timebill_ros import plugins
from timebill_ros.server.backends.base import Backend

# The registry: the classes named in plugins.NAMES['backend'], in its order.
BACKENDS = plugins.load('backend', Backend)


def backend_of(name):
    """Return the registered backend called ``name`` (``engine.backend``)."""
    return plugins.choose('backend', BACKENDS, name)


__all__ = ['Backend', 'BACKENDS', 'backend_of']
