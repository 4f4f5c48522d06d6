"""The remote backend (engine.backend openai) against a real llama.cpp server on loopback.

llama-cpp-python's OpenAI-compatible server serves the embedded GGUF on 127.0.0.1; the
failures it cannot be made to show on demand (429 / 503, silence, a stream cut mid-answer)
come from a stand-in HTTP server in the same process. The time model, the max_tokens
decision and the client's parsing are also checked on their own.
"""

import socket
import threading
import time

import pytest
from remote_helpers import (complete, LOOPBACK, remote_config, remote_service, SERVER_CTX, StandIn,
                            start_llama_server)
from ros_helpers import COEFFS
from service_helpers import ask

from timebill_ros.config import EngineConfig
from timebill_ros.engine import LlmEngine
from timebill_ros.predictors import FallbackPredictor
from timebill_ros.engine.remote.model import common_head, RemoteModel
from timebill_ros.server import status
from timebill_ros.server.goals import GoalRequest
from timebill_ros.server.backends.openai import OpenAiBackend
from timebill_ros.server.runner import JobRunner
from timebill_ros.timing.model import TimingCoefficients
from timebill_ros.timing.online import DECIDE, EXPECTED, LEAST, TimeModel, WORST
from timebill_ros.timing.remote import (decide_max_tokens, fit_probes, ProbePoint,
                                        RemoteCoefficients, RemoteTimeModel)

KILL, SKIP, PARTIAL = status.POLICY_KILL, status.POLICY_SKIP_NEXT, status.POLICY_PARTIAL
LONG_ANSWER = 'Write a long, detailed story about a warehouse robot and its day at work.'


@pytest.fixture(scope='module')
def llama(tmp_path_factory):
    """Yield the loopback llama.cpp server (module-wide; tests may stop and restart it)."""
    server = start_llama_server(tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture
def service(llama):
    """Yield a service on the loopback server whose time model starts from LOOPBACK."""
    if llama.process.poll() is not None:
        llama.start()
    service = remote_service(llama.url, LOOPBACK)
    yield service
    service.shutdown()


def goal(prompt=LONG_ANSWER, budget_s=5.0, policy=KILL, n_max=64, **fields):
    return GoalRequest(prompt=prompt, budget_s=budget_s, overrun_policy=policy,
                       max_new_tokens=n_max, **fields)


# --- the time model and the decision, alone -------------------------------------------------
def test_fit_recovers_the_times_of_exact_probes():
    truth = RemoteCoefficients(0.015, 2e-3, 9e-3, 3e-6)
    model = RemoteTimeModel(truth)
    points = []
    for n_x, n_cached in ((60, 0), (1000, 20), (1000, 999), (500, 20)):
        first = model.first_token_base_s(n_x, n_cached)
        points.append(ProbePoint(n_x, n_cached, first, 31, model._steps_base_s(n_x + 1, 31)))
    fitted = fit_probes(points)
    assert fitted.prefill_token_s == pytest.approx(truth.prefill_token_s, rel=0.01)
    assert fitted.first_token_s == pytest.approx(truth.first_token_s, abs=3e-3)
    assert fitted.step_s == pytest.approx(truth.step_s, rel=0.02)
    with pytest.raises(ValueError, match='second token'):
        fit_probes([ProbePoint(10, 0, 0.1, 0, 0.0)])


def test_max_tokens_is_n_max_when_n_hat_w_fits_else_the_most_that_fit():
    model = RemoteTimeModel(RemoteCoefficients(0.02, 1e-3, 0.01, 0.0))
    # 100 tokens (n_x), first token 0.12 s, then 0.01 s a token, before any margin.
    n_fit = model.tokens_fitting(1.0, 100, 0, 512, DECIDE)
    assert model.answer_s(100, 0, n_fit, DECIDE) <= 1.0
    assert model.answer_s(100, 0, n_fit + 1, DECIDE) > 1.0
    fits = decide_max_tokens(model, 1.0, 100, 0, 512, n_w=n_fit)
    assert (fits.max_tokens, fits.capped) == (512, False)
    capped = decide_max_tokens(model, 1.0, 100, 0, 512, n_w=n_fit + 1)
    assert (capped.max_tokens, capped.capped) == (n_fit, True)
    assert 'does not fit' in capped.describe(512)
    # The engine's cached head shortens the first token, so more tokens fit.
    assert model.tokens_fitting(1.0, 100, 90, 512, DECIDE) > n_fit


def test_a_slow_first_token_raises_the_estimates_at_once():
    model = RemoteTimeModel(RemoteCoefficients(0.02, 1e-3, 0.01, 0.0))
    before = model.prefill_s(100, EXPECTED)
    model.observe_prefill(100, 5 * before)  # the engine was queueing another client's work
    assert model.prefill_s(100, EXPECTED) == pytest.approx(5 * before)
    assert model.least_e2e_s(100) <= model.prefill_s(100, EXPECTED) <= model.prefill_s(100,
                                                                                       WORST)
    assert model.least_e2e_s(100) == model.prefill_s(100, LEAST)


def test_remote_config_is_checked():
    with pytest.raises(ValueError, match='remote_url'):
        EngineConfig(backend='openai')
    with pytest.raises(ValueError, match='engine.backend'):
        EngineConfig(backend='vllm')
    with pytest.raises(ValueError, match='remote_api'):
        EngineConfig(backend='openai', remote_url='http://h:1/v1', remote_api='responses')
    with pytest.raises(ValueError, match='scheduler.consolidation'):
        from timebill_ros.config import SchedulerConfig
        import dataclasses
        config = dataclasses.replace(remote_config('http://127.0.0.1:9/v1'),
                                     scheduler=SchedulerConfig(consolidation=True))
        OpenAiBackend.build(config, log=lambda line: None)


def test_the_cached_head_is_what_the_last_prompt_shares():
    model = RemoteModel.load(EngineConfig(), 'm')
    first = model.encode('Where is dock 3?', 'You are a warehouse robot.')
    second = model.encode('Where is dock 4?', 'You are a warehouse robot.')
    assert model.match_prefix(first).n_tokens == 0
    model.sent(first)
    assert model.match_prefix(first).n_tokens == len(first) - 1
    assert model.match_prefix(second).n_tokens == common_head(first, second) < len(second)
    model.forget()
    assert model.match_prefix(first).n_tokens == 0


# --- goals on the real server --------------------------------------------------------------
def test_the_prompt_is_the_servers_token_for_token(llama):
    """N_x here equals the prompt tokens the server counts for the same text."""
    model = RemoteModel.load(EngineConfig(), 'm')
    text = model.prompt_text('List the docks.', 'You are a robot.')
    usage = complete(llama.url, text, 1)['usage']
    assert usage['prompt_tokens'] == len(model.encode('List the docks.', 'You are a robot.'))


def test_kill_ends_the_request_at_the_deadline_and_frees_the_server(llama):
    # A time model that believes the engine 20x faster sends N_max: the answer overruns.
    fast = RemoteCoefficients(0.001, 1e-4, 4e-4, 0.0)
    service = remote_service(llama.url, fast)
    try:
        # The server holds the prompt first, and 1.5 s is ~5x its first token on a loaded
        # 2-core machine, so the deadline comes in the decode (0.6 s once came in the
        # prefill); 400 tokens take >= 3 s there at any load.
        model = RemoteModel.load(EngineConfig(), 'm')
        complete(llama.url, model.prompt_text(LONG_ANSWER), 1)
        result = ask(service, goal(budget_s=1.5, n_max=400))
        assert result.status == status.KILLED, result.message
        assert result.error_code == status.ERROR_DEADLINE
        assert result.max_tokens_sent == 400
        assert 0 <= result.kill_latency_s <= 0.05, result.kill_latency_s
        assert result.stop_phase == 'decode'
        # Freed: the next goal's first token comes well before the rest of the 400-token
        # answer could have been decoded at the pace the killed goal saw.
        step_s = result.decode_time_s / max(result.response_tokens - 1, 1)
        rest_s = (400 - result.response_tokens) * step_s
        after = ask(service, goal('Say yes.', budget_s=30.0, policy=SKIP, n_max=4))
        assert after.status == status.COMPLETED, after.message
        assert after.prefill_time_s < 0.5 * rest_s, (after.prefill_time_s, rest_s)
    finally:
        service.shutdown()


def test_kill_caps_max_tokens_to_what_fits_and_completes(llama):
    # A time model that believes the engine many times slower than it is even on a busy
    # 2-core machine (0.5 s to the first token, 0.25 s a step): the decision, not the
    # machine's speed, decides (a 0.5 s budget with 20 ms steps, and 3 s with 0.1 s steps,
    # each overran once with both cores busy).
    if llama.process.poll() is not None:
        llama.start()
    slow = RemoteCoefficients(first_token_s=0.5, prefill_token_s=1e-2, step_s=0.25,
                              step_kv_token_s=0.0)
    service = remote_service(llama.url, slow)
    try:
        result = ask(service, goal(budget_s=5.0, n_max=200))
    finally:
        service.shutdown()
    assert result.status == status.COMPLETED, result.message
    assert result.deadline_met
    assert 0 < result.max_tokens_sent < 200
    assert result.response_tokens <= result.max_tokens_sent
    assert result.pessimistic_tokens == 200  # the fallback's N^_W
    assert 'does not fit' in result.message or result.finish_reason == 'eos'
    assert result.total_time_s <= result.budget_s


def test_partial_returns_the_text_so_far_before_the_deadline(service):
    result = ask(service, goal(budget_s=0.7, policy=PARTIAL, n_max=400))
    assert result.status == status.COMPLETED, result.message
    assert result.truncated and result.deadline_met
    assert result.response and result.response_tokens > 0
    assert result.max_tokens_sent == 400
    assert result.total_time_s <= result.budget_s


def test_cancel_ends_the_request(service):
    done, results, decoding = threading.Event(), [], threading.Event()

    def on_feedback(feedback):
        if feedback.phase == status.PHASE_DECODE and feedback.tokens_generated:
            decoding.set()

    job = service.submit(goal(budget_s=30.0, policy=SKIP, n_max=400), on_feedback,
                         lambda result: (results.append(result), done.set()))
    assert decoding.wait(20)
    start = time.monotonic()
    service.cancel(job)
    assert done.wait(5)
    assert results[0].status == status.CANCELED
    assert time.monotonic() - start < 0.1


def test_infeasible_goals_are_refused_before_any_request(service):
    result = ask(service, goal(budget_s=0.003))
    assert result.status == status.REJECTED and result.infeasible
    assert result.error_code == status.ERROR_INFEASIBLE
    assert service.runner.opened == 0
    assert result.max_tokens_sent == 0


def test_a_busy_server_raises_the_first_token_estimate_and_admission_refuses(llama, service):
    short = dict(prompt='Say yes.', n_max=4)
    assert ask(service, goal(budget_s=20.0, policy=SKIP, **short)).status == status.COMPLETED
    idle = ask(service, goal(budget_s=0.06, **short))  # its prompt is held: admitted
    assert idle.status != status.REJECTED, idle.message
    # Another client holds the one-request server for a few seconds (400 tokens that ignore
    # EOS: an answer that could stop early would not hold it for sure).
    other = threading.Thread(target=complete, args=(llama.url, LONG_ANSWER, 400, True),
                             daemon=True)
    other.start()
    time.sleep(0.3)
    late = ask(service, goal(budget_s=20.0, policy=SKIP, **short))
    assert late.status == status.COMPLETED
    assert late.prefill_time_s > 0.5  # it queued behind the other request
    # The same goal with the same budget is now refused at once, before any request.
    opened = service.runner.opened
    refused = ask(service, goal(budget_s=0.06, **short))
    assert refused.status == status.REJECTED and refused.infeasible, refused.message
    assert service.runner.opened == opened
    other.join(30)


def test_chat_api_goals_complete(llama):
    service = remote_service(llama.url, LOOPBACK, remote_api='chat')
    try:
        result = ask(service, goal('Say hello.', budget_s=5.0, policy=SKIP, n_max=8))
        assert result.status == status.COMPLETED, result.message
        assert result.response.strip()
    finally:
        service.shutdown()


def test_start_up_probes_fit_the_loopback_server(llama):
    service = OpenAiBackend.build(remote_config(llama.url), log=lambda line: None)
    try:
        co = service.time_model.coefficients
        assert 0 < co.prefill_token_s < 0.05 and 0 < co.step_s < 0.5
        assert service.engine.name == llama.models()[0]
        service.start()
        result = ask(service, goal('Say yes.', budget_s=5.0, n_max=8))
        assert result.status == status.COMPLETED, result.message
        # Whether t^_WCET covers the run depends on the machine's load between the probes
        # and the goal: that coverage is a benchmark figure (`timebill bench`), not a test's.
        assert result.predicted_wcet_s > 0
    finally:
        service.shutdown()


def test_a_server_dying_mid_answer_fails_the_goal_and_a_restart_serves_again(llama, service):
    threading.Timer(1.0, llama.kill).start()
    result = ask(service, goal(budget_s=30.0, policy=SKIP, n_max=400))
    assert result.status == status.FAILED
    assert result.error_code == status.ERROR_REMOTE_STREAM, result.message
    down = ask(service, goal('Say yes.', budget_s=5.0, policy=SKIP, n_max=4))
    assert down.error_code == status.ERROR_REMOTE_UNREACHABLE, down.message
    llama.start()
    again = ask(service, goal('Say yes.', budget_s=10.0, policy=SKIP, n_max=4))
    assert again.status == status.COMPLETED, again.message


# --- failures the stand-in causes ------------------------------------------------------------
@pytest.mark.parametrize('mode,code', [('busy503', status.ERROR_REMOTE_BUSY),
                                       ('busy429', status.ERROR_REMOTE_BUSY),
                                       ('http500', status.ERROR_REMOTE_HTTP),
                                       ('cut', status.ERROR_REMOTE_STREAM)])
def test_each_failure_ends_the_goal_with_its_code(mode, code):
    stand_in = StandIn(mode)
    service = remote_service(stand_in.url, LOOPBACK)
    try:
        for _ in range(2):  # and the service keeps serving
            result = ask(service, goal(budget_s=5.0))
            assert result.status == status.FAILED and result.error_code == code, result.message
            assert result.finish_reason == status.FINISH_ERROR
    finally:
        service.shutdown()
        stand_in.close()


def test_a_silent_engine_times_out_and_a_refused_connection_is_unreachable():
    stand_in = StandIn('silent')
    service = remote_service(stand_in.url, LOOPBACK, remote_idle_timeout_s=0.3)
    try:
        result = ask(service, goal(budget_s=10.0, policy=SKIP))
        assert result.error_code == status.ERROR_REMOTE_TIMEOUT, result.message
        killed = ask(service, goal(budget_s=0.25))  # Kill: its deadline comes first
        assert killed.status == status.KILLED
    finally:
        service.shutdown()
        stand_in.close()
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    service = remote_service(f'http://127.0.0.1:{port}/v1', LOOPBACK)
    try:
        result = ask(service, goal(budget_s=5.0))
        assert result.error_code == status.ERROR_REMOTE_UNREACHABLE, result.message
    finally:
        service.shutdown()


def _local_runner(model, tokenizer, coefficients):
    """Return a local JobRunner on the tiny model (the fallback), fallback predictor."""
    config = remote_config('http://127.0.0.1:9/v1', decode_weights='float32')
    engine = LlmEngine(config.engine, config.eviction, model=model, tokenizer=tokenizer)
    return JobRunner(engine, FallbackPredictor(), TimeModel(coefficients), config)


def test_goals_fall_back_to_the_local_engine_while_the_remote_one_is_down(
        tiny_model, smollm2_tokenizer):
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    url = f'http://127.0.0.1:{port}/v1'
    service = remote_service(url, LOOPBACK,
                             fallback=_local_runner(tiny_model, smollm2_tokenizer, COEFFS))
    try:
        result = ask(service, goal('Say yes.', budget_s=5.0, n_max=6))
        assert result.status == status.COMPLETED, result.message
        assert result.executor == 'fallback' and result.response_tokens == 6
        assert 'local fallback' in result.message and 'unreachable' in result.message
    finally:
        service.shutdown()
    slow = TimingCoefficients(a=1e-9, b=1e-5, c=2.0, p=1e-6, q=1e-3)  # 2 s a prefill
    service = remote_service(url, LOOPBACK,
                             fallback=_local_runner(tiny_model, smollm2_tokenizer, slow))
    try:
        result = ask(service, goal('Say yes.', budget_s=0.5, n_max=6))
        assert result.error_code == status.ERROR_REMOTE_UNREACHABLE, result.message
        assert 'cannot fit it either' in result.message and result.executor != 'fallback'
    finally:
        service.shutdown()


def test_json_schema_goals_are_refused_on_the_remote_backend(service):
    result = ask(service, goal(json_schema='{"type": "object"}'))
    assert result.status == status.REJECTED
    assert result.error_code == status.ERROR_INVALID_SCHEMA
    assert 'backend openai' in result.message


def test_server_context_is_the_configured_one():
    model = RemoteModel.load(EngineConfig(remote_context_tokens=SERVER_CTX), 'm')
    assert model.context_tokens == SERVER_CTX
