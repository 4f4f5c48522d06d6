"""The prefix store, and reuse through the engine, the time model and the service.

Store: lookups, inserts, the memory bound, pins. Engine: a hit answers as a fresh prefill.
Time model: the cost of a hit. Service: admission on the cached cost, a dropped entry.
"""

import threading

import pytest
import torch
from hypothesis import given, settings, strategies as st

from service_helpers import ask, core_service
from timebill_ros.config import EngineConfig, OverrunConfig, PrefixCacheConfig
from timebill_ros.engine.prefix_store import PrefixStore
from timebill_ros.engine import fixed_chunks
from timebill_ros.engine.stopping import DEADLINE, StopCriteria, StopCriterion
from timebill_ros.server import status
from timebill_ros.server.goals import GoalRequest
from timebill_ros.timing.model import Calibration, TimingCoefficients, now_iso
from timebill_ros.timing.online import EXPECTED, LEAST, TimeModel
from timebill_ros.timing.prefix import fit_copy_token_s, hit_mape_pct, hit_rest_s

BLOCK = 4
KV_SHAPE = (2, 2, 1, BLOCK, 2)  # (L, 2, H, T, D): 32 floats, 128 bytes a block


def _kv(value=0.0):
    return torch.full(KV_SHAPE, float(value))


def _store(max_blocks=100, min_tokens=0, fresh=1):
    return PrefixStore(BLOCK, max_blocks * 128, min_tokens, fresh)


def _insert(store, ids, pin=False):
    return store.insert(ids, lambda index: (_kv(index), None), pin=pin)


# --- the store ---------------------------------------------------------------------------
def test_match_is_the_longest_token_exact_head_in_whole_blocks():
    store = _store()
    assert _insert(store, list(range(20))) == 5
    # Shares 10 tokens: two whole blocks (8 tokens) match, the third differs at token 10.
    match = store.match(list(range(10)) + [99] * 10)
    assert match.n_tokens == 8 and len(match.blocks) == 2
    assert [block.kv[0, 0, 0, 0, 0].item() for block in match.blocks] == [0.0, 1.0]
    assert store.match([5] + list(range(1, 20))).n_tokens == 0  # differs in block 0


def test_a_match_leaves_the_fresh_tail_to_the_prefill():
    store = _store(fresh=5)
    _insert(store, list(range(20)))
    # The same 20 tokens: at most (20 - 5) // 4 = 3 blocks may come from the store.
    assert store.match(list(range(20))).n_tokens == 12
    assert store.usable_tokens(5) == 0


def test_min_tokens_makes_short_heads_misses_and_keeps_short_prompts_out():
    store = _store(min_tokens=12)
    assert _insert(store, list(range(8))) == 0  # shorter than min_tokens: not stored
    _insert(store, list(range(20)))
    assert store.match(list(range(8)) + [99] * 12).n_tokens == 0  # 8 < 12: a miss
    assert store.match(list(range(12)) + [99] * 8).n_tokens == 12
    stats = store.stats()
    assert (stats.lookups, stats.hits, stats.hit_tokens) == (2, 1, 12)
    assert stats.hit_rate == 0.5


def test_shared_heads_are_stored_once():
    store = _store()
    _insert(store, list(range(16)))
    added = _insert(store, list(range(8)) + [50 + i for i in range(8)])
    assert added == 2  # blocks 0 and 1 were there
    assert store.stats().n_blocks == 6 and store.stats().bytes == 6 * 128


def test_least_recently_used_blocks_go_first():
    store = _store(max_blocks=4)
    a, b = list(range(8)), list(range(100, 108))
    _insert(store, a)
    _insert(store, b)
    store.match(a + [999])  # a is used again: b is now the oldest
    _insert(store, list(range(200, 208)))
    assert store.held_tokens(a) == 8
    assert store.held_tokens(b) == 0
    assert store.stats().dropped_blocks == 2


def test_pinned_blocks_stay_and_an_insert_without_room_stops():
    store = _store(max_blocks=3)
    _insert(store, list(range(8)), pin=True)
    assert _insert(store, list(range(100, 112))) == 1  # room for one block only
    assert store.held_tokens(list(range(8))) == 8
    _insert(store, list(range(200, 204)))  # drops the unpinned block, never a pinned one
    assert store.held_tokens(list(range(8))) == 8
    assert store.stats().pinned_blocks == 2


def test_a_block_larger_than_the_bound_is_not_stored():
    store = PrefixStore(BLOCK, 100, 0, 1)  # a block is 128 bytes
    assert _insert(store, list(range(8))) == 0
    assert store.stats().bytes == 0


def test_make_block_none_ends_the_insert():
    store = _store()
    assert store.insert(list(range(16)), lambda index: None if index == 2 else (_kv(), None)) == 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(['insert', 'match', 'pin']),
                          st.integers(0, 5), st.integers(1, 6)), max_size=40),
       st.integers(1, 8))
def test_the_memory_bound_holds_whatever_arrives(ops, max_blocks):
    store = _store(max_blocks=max_blocks)
    for op, head, n_blocks in ops:
        ids = [head] * BLOCK + list(range(head * 1000, head * 1000 + (n_blocks - 1) * BLOCK))
        if op == 'match':
            match = store.match(ids)
            assert match.n_tokens <= len(ids)
        else:
            _insert(store, ids, pin=op == 'pin')
        stats = store.stats()
        assert stats.bytes <= stats.max_bytes
        assert stats.bytes == stats.n_blocks * 128


def test_the_store_is_thread_safe():
    store = _store(max_blocks=20)
    errors = []

    def work(seed):
        try:
            for i in range(200):
                ids = list(range(seed, seed + 4 * (1 + i % 5)))
                _insert(store, ids) if i % 2 else store.match(ids)
        except Exception as exc:  # noqa: BLE001 - collected for the assert
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed * 7,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and store.stats().bytes <= store.max_bytes


# --- through the engine ------------------------------------------------------------------
CONTEXT = 'Robot log: ' + ' '.join(f'event {i} at dock {i % 7}' for i in range(60))
PREFIX = PrefixCacheConfig(min_tokens=32, block_tokens=16)


@pytest.mark.parametrize('forward', ['lean', 'transformers'])
@pytest.mark.parametrize('where', ['system', 'user'])
def test_a_hit_answers_as_a_fresh_prefill(make_tiny_engine, forward, where):
    engine = make_tiny_engine(forward=forward, prefix_cache=PREFIX)

    def encode(question):
        if where == 'system':
            return engine.encode(question, CONTEXT)
        return engine.encode(f'{CONTEXT}\n\n{question}')

    first, follow = encode('What happened at dock 3?'), encode('Where is the robot now?')
    engine.prefill(first, StopCriteria(), prefix=engine.match_prefix(first),
                   store=engine.prefix_store)
    match = engine.match_prefix(follow)
    assert match.n_tokens >= len(follow) - 64 and match.n_tokens % 16 == 0
    hit = engine.prefill(follow, StopCriteria(), prefix=match, store=engine.prefix_store)
    fresh = engine.prefill(follow, StopCriteria())
    assert hit.n_cached == match.n_tokens and fresh.n_cached == 0
    assert hit.first_token == fresh.first_token
    torch.testing.assert_close(hit.pooled, fresh.pooled, rtol=1e-5, atol=1e-5)
    for layer in range(engine.n_layers):
        for got, want in zip(engine.layer_kv(hit, layer), engine.layer_kv(fresh, layer)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # The eviction then scores the same keys from the same observation window.
    assert engine.evict(hit, 0.5) == engine.evict(fresh, 0.5)
    assert (engine.decode(hit, 12, StopCriteria()).token_ids
            == engine.decode(fresh, 12, StopCriteria()).token_ids)


def test_a_prefix_of_other_ids_is_refused(make_tiny_engine):
    engine = make_tiny_engine(prefix_cache=PREFIX)
    ids = engine.encode('Where is the robot now?', CONTEXT)
    engine.prefill(ids, StopCriteria(), store=engine.prefix_store)
    match = engine.match_prefix(ids)
    with pytest.raises(ValueError, match='not a head'):
        engine.prefill([ids[1]] + ids[1:], StopCriteria(), prefix=match)


def test_new_pooled_layers_clear_the_store(make_tiny_engine):
    engine = make_tiny_engine(prefix_cache=PREFIX)
    ids = engine.encode('Where is the robot now?', CONTEXT)
    engine.prefill(ids, StopCriteria(), store=engine.prefix_store)
    assert engine.prefix_store.stats().n_blocks > 0
    engine.pool_layers = (1, 2)
    assert engine.prefix_store.stats().n_blocks == 0


def test_a_pinned_system_prompt_is_a_hit_from_the_first_goal(make_tiny_engine):
    engine = make_tiny_engine(prefix_cache=PREFIX)
    pinned = engine.pin_prefix(CONTEXT)
    assert pinned > 0 and engine.prefix_store.stats().pinned_blocks == pinned // 16
    ids = engine.encode('Which dock was busiest?', CONTEXT)
    assert engine.match_prefix(ids).n_tokens == pinned


def test_no_store_means_no_match(make_tiny_engine):
    engine = make_tiny_engine()
    assert engine.prefix_store is None
    assert engine.match_prefix(engine.encode('hi', CONTEXT)).n_tokens == 0


# --- the time model on hits ----------------------------------------------------------------
CO = TimingCoefficients(a=2e-7, b=1e-3, c=0.05, p=3e-6, q=6e-3)


def test_a_hit_costs_its_fresh_tokens_and_the_copy():
    model = TimeModel(CO, copy_token_s=2e-5)
    want = CO.prefill_s(3600) - CO.prefill_s(3500) + CO.c + 2e-5 * 3600
    assert model.prefill_s(3600, EXPECTED, n_cached=3500) == pytest.approx(want)
    assert model.prefill_s(3600, EXPECTED, n_cached=3500) < model.prefill_s(3600) / 10
    assert model.least_e2e_s(3600, 3500) < model.least_e2e_s(3600) / 10
    # A measured hit exactly as modelled leaves the speed factor at 1.
    model.observe_prefill(3600, want, 1, 3500)
    assert model.status('prefill').speed_factor == pytest.approx(1.0)


def test_the_copy_cost_is_fitted_from_hit_probes():
    points = [(p, n, hit_rest_s(CO, p, n) + 3e-5 * n) for p, n in
              ((960, 1024), (1984, 2048), (3520, 3584))]
    assert fit_copy_token_s(CO, points) == pytest.approx(3e-5)
    assert hit_mape_pct(CO, points, 3e-5) == pytest.approx(0.0, abs=1e-9)
    assert fit_copy_token_s(CO, []) == 0.0


def test_calibrations_keep_their_prefix_points(tmp_path):
    calibration = Calibration(
        coefficients=CO, model_key='m', device='cpu', dtype='float32', threads=0,
        prefill_mape_pct=None, decode_mape_pct=None, n_points=0, profiling_s=0.0,
        created=now_iso(), method='startup', prefill_points=(), decode_points=(),
        prefix_points=((960, 1024, 0.25),))
    path = tmp_path / 'c.yaml'
    calibration.save(path)
    loaded = Calibration.load(path)
    assert loaded.prefix_points == ((960, 1024, 0.25),)
    assert loaded.copy_token_s == pytest.approx(calibration.copy_token_s)
    assert loaded.copy_token_s > 0
    with pytest.raises(ValueError, match='prefix_points'):
        Calibration.from_dict(dict(calibration.to_dict(), prefix_points=[[1, 2]]))


# --- through the service -------------------------------------------------------------------
# Slow on paper: 10 ms a prompt token, so a 500-token prompt "needs" 5 s, its hit 0.2 s.
SLOW = TimingCoefficients(a=0.0, b=0.01, c=0.01, p=1e-6, q=1e-3)


def _service(tiny_model, tokenizer, start=True):
    engine_cfg = EngineConfig(max_new_tokens=8, prefill_chunk_tokens=64, decode_weights='float32')
    return core_service(tiny_model, tokenizer, engine_cfg, SLOW, start, prefix_cache=PREFIX,
                        overrun=OverrunConfig(default_policy='kill'))


def _ask(service, question, budget_s):
    return ask(service, GoalRequest(question, system_prompt=CONTEXT, budget_s=budget_s))


def test_follow_ups_are_admitted_on_the_cached_cost(tiny_model, smollm2_tokenizer):
    service = _service(tiny_model, smollm2_tokenizer)
    try:
        refused = _ask(service, 'What happened at dock 3?', 2.0)
        assert refused.status == status.REJECTED and refused.infeasible
        first = _ask(service, 'What happened at dock 3?', 100.0)
        assert first.status == status.COMPLETED and first.cached_tokens == 0
        follow = _ask(service, 'Where is the robot now?', 2.0)
        assert follow.status == status.COMPLETED, follow.message
        assert follow.cached_tokens > 0 and follow.min_time_s < 1.0
        stats = service.status().prefix
        assert stats.hits == 1 and stats.lookups == 3 and stats.bytes > 0
    finally:
        service.shutdown()


def test_a_goal_whose_entry_was_dropped_is_checked_again(tiny_model, smollm2_tokenizer):
    service = _service(tiny_model, smollm2_tokenizer, start=False)
    try:
        ids = service.engine.encode('What happened at dock 3?', CONTEXT)
        service.engine.prefill(ids, StopCriteria(), store=service.engine.prefix_store)
        done, results = threading.Event(), []
        job = service.submit(GoalRequest('Where is the robot now?', system_prompt=CONTEXT,
                                         budget_s=2.0),
                             lambda feedback: None,
                             lambda result: (results.append(result), done.set()))
        assert job is not None and job.n_cached > 0  # admitted on the hit
        service.engine.prefix_store.clear()  # dropped before it runs
        service.start()
        assert done.wait(60)
        result = results[0]
        assert result.status == status.REJECTED and result.infeasible
        assert 'cached prompt head went from' in result.message
        assert result.cached_tokens == 0
    finally:
        service.shutdown()


def test_least_time_on_a_hit_uses_the_least_bound(tiny_model, smollm2_tokenizer):
    model = TimeModel(SLOW)
    assert model.prefill_s(500, LEAST, n_cached=480) < model.prefill_s(500, LEAST)


class _StopAt(StopCriterion):
    """Records each check's arguments; says DEADLINE from check number ``at`` on."""

    def __init__(self, at):
        self.calls, self.at = [], at

    def should_stop(self, n_generated, last_token_id, n_prefilled=None):
        self.calls.append((n_generated, last_token_id, n_prefilled))
        return DEADLINE if len(self.calls) >= self.at else None


def test_a_stop_during_the_prefix_copy_ends_the_copy(make_tiny_engine):
    """The copy into the store checks the goal's interrupt before each block.

    The prompt's blocks are copied after its last chunk; a deadline that passes meanwhile
    ends the copy there (the blocks copied stay), and the prefill returns for the goal's own
    next check to stop it.
    """
    engine = make_tiny_engine(prefix_cache=PREFIX)
    ids = engine.encode('Where is the robot now?', CONTEXT)
    n_blocks = len(ids) // PREFIX.block_tokens
    # Checks: one per layer of the one chunk, then one per block: fire before block 3.
    interrupt = StopCriteria([_StopAt(engine.n_layers + 3)])
    state = engine.prefill(ids, StopCriteria(), chunk_plan=fixed_chunks(len(ids)),
                           interrupt=interrupt, store=engine.prefix_store)
    assert state.n_x == len(ids) and n_blocks > 3
    assert engine.prefix_store.stats().n_blocks == 2
    calls = interrupt.criteria[0].calls
    assert len(calls) == engine.n_layers + 3 and calls[-1] == (0, None, len(ids))
    engine.prefill(ids, StopCriteria(), store=engine.prefix_store)  # no stop: all of them
    assert engine.prefix_store.stats().n_blocks == n_blocks


def test_block_sums_do_not_depend_on_the_chunk_edges():
    """The pool's block sums: whole blocks summed at once, cut blocks on their own."""
    from timebill_ros.engine.forward import HiddenPool
    hidden = torch.randn(1, 17, 8, generator=torch.Generator().manual_seed(0))
    pools = []
    for sizes in ([17], [3, 9, 5], [4, 4, 9], [1] * 17):
        pool, begin = HiddenPool(1e-6, (1,), block_tokens=4), 0
        for size in sizes:
            pool.add(1, hidden[:, begin:begin + size])
            begin += size
        pools.append(pool)
    unit = hidden[0] * torch.rsqrt(hidden[0].pow(2).mean(-1, keepdim=True) + 1e-6)
    for index in range(5):
        expected = unit[4 * index:4 * index + 4].sum(0)
        for pool in pools:
            assert torch.allclose(pool.block_sum(index)[0], expected, atol=1e-5)
