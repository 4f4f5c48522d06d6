"""Predictors that appear after the start: the node builds a service with them and switches.

Real node over real rclpy, tiny model; upgrade_check is injected (the default looks for the
RLP / readout files, server/factory.py predictor_upgrade, tested in test_goals_and_params).
"""

import gc
import threading
import weakref

from rclpy.parameter import Parameter
from ros_helpers import GatedEngine, node_and_client, wait_for, tiny_factory

from timebill_ros.action import Instruct
from timebill_ros.predictors import FallbackPredictor
from timebill_ros.ros.client import TimebillClient

R = Instruct.Result


class BuiltLater(FallbackPredictor):
    """A predictor the second service gets (stands in for an RLP built in the background)."""

    name = 'built-later'


def test_the_node_switches_to_predictors_built_after_it_started(tiny_model, smollm2_tokenizer):
    ready = threading.Event()
    first = FallbackPredictor()
    first.name = 'fallback (rlp unavailable: not built yet)'
    factory = tiny_factory(tiny_model, smollm2_tokenizer, GatedEngine, [first, BuiltLater()])
    built = factory.built

    def upgrade_check(service):
        return ('the test RLP', ('rlp.onnx', 1.0)) if ready.is_set() else None

    overrides = [Parameter('engine.max_new_tokens', value=8),
                 Parameter('predictor.reload_check_s', value=0.1)]
    with node_and_client(factory, 'robot5', overrides, 'reload_client',
                         upgrade_check=upgrade_check) as (server, _, _):
        with TimebillClient('/robot5/timebill/instruct', 'reload_planner', wait_s=20) as llm:
            first = llm.ask('Plan a route to the dock.', budget_s=60.0)
            assert first.status == R.COMPLETED and first.predictor.startswith('fallback')
            old = server.service
            old.engine.gate.clear()  # hold a goal: the switch must wait for it
            held = llm.send('Describe the dock.', budget_s=60.0)
            assert old.engine.waiting.wait(30)
            ready.set()
            wait_for(lambda: len(built) == 2 and built[1].healthy, 30, 'no second service')
            served_meanwhile = llm.send('Is the gripper open?', budget_s=60.0)
            assert server.service is old  # not switched while a goal runs
            old.engine.gate.set()
            assert held.result(60).status == R.COMPLETED
            assert held.result().predictor.startswith('fallback')
            assert served_meanwhile.result(60).status == R.COMPLETED
            wait_for(lambda: server.service is built[1], 30, 'never switched')
            after = llm.ask('Plan a route to the dock.', budget_s=60.0)
            assert after.status == R.COMPLETED and after.predictor == 'built-later'
            assert not old.healthy  # the old service was shut down after the switch
            threading.Event().wait(0.5)  # more timer ticks: the same files are not rebuilt
            assert len(built) == 2


def test_a_service_built_while_the_node_shuts_down_is_never_swapped_in(
        tiny_model, smollm2_tokenizer):
    """shutdown() during a rebuild: the replacement shuts down too, no server thread is left."""
    building, release = threading.Event(), threading.Event()
    inner = tiny_factory(tiny_model, smollm2_tokenizer)

    def factory(config, log):
        if inner.built:  # the replacement: held until the node shut down
            building.set()
            release.wait(30)
        return inner(config, log)

    overrides = [Parameter('engine.max_new_tokens', value=8),
                 Parameter('predictor.reload_check_s', value=0.1)]
    with node_and_client(factory, 'robot6', overrides, 'reload_client_2',
                         upgrade_check=lambda service: ('the test RLP', ('x', 1.0))) as (
            server, _, _):
        assert building.wait(30), 'no rebuild started'
        old = server.service
        server.shutdown()
        release.set()
        wait_for(lambda: len(inner.built) == 2 and not server.slot.rebuilding, 30,
                 'the rebuild never ended')
        assert not inner.built[1].healthy  # started, then shut down: never swapped in
        assert server.service is old and not old.healthy


def test_the_retired_service_is_freed_from_a_frozen_heap(tiny_model, smollm2_tokenizer):
    """freeze_heap, as the server process: the swapped-out service and its engine are collected.

    Frozen at configure, the old service's reference cycles are out of the collector's reach;
    the node unfreezes, collects and freezes again after the swap (a soak's node kept ~420 MB).
    """
    ready = threading.Event()
    inner = tiny_factory(tiny_model, smollm2_tokenizer)
    services = []  # weak references only: the test must not keep a service alive

    def factory(config, log):
        service = inner(config, log)
        inner.built.clear()
        services.append(weakref.ref(service))
        return service

    overrides = [Parameter('engine.max_new_tokens', value=8),
                 Parameter('predictor.reload_check_s', value=0.1)]
    try:
        with node_and_client(factory, 'robot7', overrides, 'reload_client_3', freeze_heap=True,
                             upgrade_check=lambda service: (
                                 ('the test RLP', ('x', 1.0)) if ready.is_set() else None)) as (
                server, _, _):
            with TimebillClient('/robot7/timebill/instruct', 'reload_planner_3', wait_s=20) as llm:
                assert llm.ask('Plan a route to the dock.', budget_s=60.0).status == R.COMPLETED
                assert gc.get_freeze_count() > 0
                old_engine = weakref.ref(server.service.engine)
                ready.set()
                wait_for(lambda: len(services) == 2 and server.service is services[1](), 30,
                         'never switched')
                wait_for(lambda: services[0]() is None and old_engine() is None, 10,
                         'the old service was not freed')
                with server.slot.lock:  # the swap holds it until the old service is freed
                    assert gc.get_freeze_count() > 0  # frozen again, with the new service
                assert llm.ask('Describe the dock.', budget_s=60.0).status == R.COMPLETED
    finally:
        gc.unfreeze()  # the test process's heap: as it was
