"""Which TimeBillService serves, and its hot swap for one with predictors built after the start.

A robot's server starts before its length predictor is built (``timebill predictor build`` runs
beside it) and serves with the fallback N^ = N_max meanwhile. When the predictor's files
appear, a replacement service is built beside the running one and swapped in once the running
one is idle: no goal is cut, none waits for the build. The ROS node keeps the lifecycle and
tells the slot whether it is active; never imports rclpy.
"""

import threading
import time

SWAP_POLL_S = 0.05  # how often a built replacement service checks that the old one is idle, s


class ServiceSlot:
    """Holds the serving TimeBillService; builds and swaps in a replacement when asked.

    factory(config, log) -> TimeBillService. upgrade_check(service) -> ``(text, key)`` of
    predictor files that exist now but are not in use, or None (server/factory.py
    predictor_upgrade); each key is built once. log(text) / fault(where): the node's logger
    and its fault report (the traceback of the exception being handled). on_swap(service):
    called under the lock when a replacement goes in (the node takes its config).
    on_retired(): called under the lock once the old service is shut down and no reference
    to it is left here (the node collects its objects: they were frozen at configure).
    ``lock`` orders submits against swaps and releases: a replacement never goes in
    mid-submit, and a goal submitted during a swap waits for its end.
    """

    def __init__(self, factory, upgrade_check, log, fault, on_swap=lambda service: None,
                 on_retired=lambda: None):
        self.factory = factory
        self.upgrade_check = upgrade_check
        self.log = log
        self.fault = fault
        self.on_swap = on_swap
        self.on_retired = on_retired
        self.lock = threading.Lock()
        self.service = None  # the TimeBillService while configured
        self.active = False  # set by the node's lifecycle: swaps happen only while active
        self.rebuilding = False
        self.closing = False  # close() was called: no replacement service is swapped in
        self._tried = set()  # keys of upgrade_check already built (once each)

    def install(self, service):
        """Make ``service`` the serving one (at configure)."""
        with self.lock:
            self.service = service

    def release(self):
        """Take the serving service out; return it (None if there was none)."""
        with self.lock:
            service, self.service = self.service, None
        return service

    def close(self):
        """Refuse every later swap; return the serving service (None if none)."""
        with self.lock:
            self.closing = True
            return self.service

    def check_upgrade(self, read_config):
        """Start building a service with predictors that appeared, once per file set.

        read_config() -> the ServerConfig to build it with (the node's parameters now).
        Called from the node's timer; does nothing while inactive, closing or building.
        """
        service = self.service
        if service is None or not self.active or self.rebuilding or self.closing:
            return
        found = self.upgrade_check(service)
        if found is None or found[1] in self._tried:
            return
        what, key = found
        self._tried.add(key)
        self.rebuilding = True
        self.log(f'{what} is ready: building a service with it beside the running one')
        threading.Thread(target=self._rebuild, args=(what, read_config),
                         name='timebill-rebuild', daemon=True).start()

    def _rebuild(self, what, read_config):
        """Build the replacement service and swap it in once the running one is idle."""
        try:
            new = self.factory(read_config(), self.log)
            new.start()
        except Exception:
            self.fault(f'building a service with {what}')
            self.rebuilding = False
            return
        if not self._swap_when_idle(new):
            new.shutdown()
            self.rebuilding = False
            self.log(f'{what}: not switched (the node left the active state)')
            return
        self.rebuilding = False
        self.log(f'switched to a service with {what}: length predictor {new.predictor.name}, '
                 f'readout {"on" if new.readout is not None else "off"}')

    def _swap_when_idle(self, new) -> bool:
        """Swap ``new`` in when no goal is queued or running, retire the old one; True if done.

        All under the lock, while nothing runs: the old service shuts down (idle, it ends no
        goal) and ``on_retired`` frees it before ``new`` takes its first goal.
        """
        while True:
            with self.lock:
                old = self.service
                if old is None or not self.active or self.closing:
                    return False
                if old.idle:
                    self.on_swap(new)
                    self.service = new
                    try:
                        old.shutdown()
                        del old  # the last reference here: on_retired can collect it
                        self.on_retired()
                    except Exception:
                        self.fault('retiring the old service')
                    return True
            time.sleep(SWAP_POLL_S)
