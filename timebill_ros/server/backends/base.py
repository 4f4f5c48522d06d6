"""Base class of backends: where goals run, and how the service over them is built."""

import abc


class Backend(abc.ABC):
    """One value of ``engine.backend``: builds the service whose goals run there.

    ``name``: the parameter's value (the registry key, plugins.NAMES['backend']). A backend
    builds the TimeBillService with its runner, time model and predictor (:meth:`build`),
    first refusing the settings it cannot serve (:meth:`check_config`).
    """

    name = 'base'

    @classmethod
    def check_config(cls, config) -> None:
        """Raise ValueError for what this backend cannot do, naming the parameter."""

    @classmethod
    @abc.abstractmethod
    def build(cls, config, log=print):
        """Return the TimeBillService of ``config`` (a ServerConfig), not yet started."""
