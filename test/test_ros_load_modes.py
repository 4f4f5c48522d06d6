"""The ROS fuzz of test_ros_load.py in continuous batching and with the offload executor.

Its own module: the node fixtures of one module hold rclpy's context while they live.
"""

import pytest
from rclpy.parameter import Parameter
from ros_helpers import COEFFS
from test_ros_load import _run_sequence, _serving, fuzz_settings, given_sequences

from timebill_ros.predictors import FallbackPredictor
from timebill_ros.server.service import TimeBillService


@pytest.fixture(scope='module', params=['continuous', 'offload'])
def batched_load(request, slow_model, smollm2_tokenizer):
    """Yield the same in ``scheduler.continuous`` batching (B = 4) or with offload.

    Offload: the predictor reads the number in the prompt as N^ ("Count to 12." -> 12), and
    goals with u_J >= 8 tokens go to the offload executor (a second engine on the model).
    """
    from timebill_ros.engine import LlmEngine
    from timebill_ros.timing.online import TimeModel
    from test_service import PromptLengthPredictor

    def factory(config, log):
        def engine():
            return LlmEngine(config.engine, config.eviction, model=slow_model,
                             tokenizer=smollm2_tokenizer)
        if request.param == 'continuous':
            return TimeBillService(config, engine(), FallbackPredictor(), COEFFS, log=log)
        return TimeBillService(config, engine(), PromptLengthPredictor(), COEFFS, log=log,
                               offload=(engine(), TimeModel(COEFFS)), tau_tokens=8)

    more = ([Parameter('scheduler.continuous', value=True),
             Parameter('scheduler.batch_size', value=4)]
            if request.param == 'continuous' else [])
    served = _serving(f'load_{request.param}', factory, more)
    session = next(served)
    session['mode'] = request.param
    yield session
    next(served, None)  # the node down first, whatever the check below says
    if request.param == 'offload':  # the fuzz did reach the offload executor
        assert session['tally']['executor offload'] > 0, dict(session['tally'])


@fuzz_settings
@given_sequences
def test_fuzzed_sequences_in_continuous_batching_and_with_offload(batched_load, sequence):
    """The same property with goals batched mid-answer, or split between two executors."""
    _run_sequence(batched_load, sequence)
