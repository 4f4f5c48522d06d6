"""Helpers shared by the tests that run the core service (no ROS) on a small real model."""

import threading
import time

from timebill_ros.config import ServerConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.predictors import FallbackPredictor
from timebill_ros.server.service import TimeBillService


def core_service(model, tokenizer, engine_config, coefficients, start=True, **groups):
    """Return a TimeBillService on ``model`` with the fallback predictor (started).

    groups: other ServerConfig groups (``overrun=OverrunConfig(...)``, ``prefix_cache=...``);
    the engine has a prefix store only when ``prefix_cache`` is given.
    """
    config = ServerConfig(engine=engine_config, **groups)
    engine = LlmEngine(engine_config, config.eviction, model=model, tokenizer=tokenizer,
                       prefix_cache=groups.get('prefix_cache'))
    service = TimeBillService(config, engine, FallbackPredictor(), coefficients)
    if start:
        service.start()
    return service


def ask(service, request, timeout_s=120):
    """Submit ``request`` (a GoalRequest) and return its JobResult."""
    done, results = threading.Event(), []
    service.submit(request, lambda feedback: None,
                   lambda result: (results.append(result), done.set()))
    assert done.wait(timeout_s), 'no result'
    return results[0]


def wait_schema_compiles(timeout_s=120.0):
    """Wait for json_schema compiles still running on their threads (a test's slow schema).

    A compile past its goal's limit goes on (xgrammar cannot be stopped); tests that start
    one wait for it, so no server thread outlives them.
    """
    end = time.monotonic() + timeout_s
    while any(t.name == 'timebill-schema' for t in threading.enumerate()):
        assert time.monotonic() < end, 'a json_schema compile ran for over 120 s'
        time.sleep(0.02)


def slow_schema(tag, n_fields=30):
    """Return a small json_schema whose compile is slow (~1.9 s for 30 fields, 2 x86 cores).

    String length bounds unroll into many grammar rules; ``tag`` makes it new to any cache.
    """
    import json
    fields = {f'{tag}{i}': {'type': 'string', 'minLength': 50, 'maxLength': 300}
              for i in range(n_fields)}
    return json.dumps({'type': 'object', 'properties': fields})
