"""Build the service of ``engine.backend: openai``: goals served by an existing engine.

The model's tokenizer and the length predictor load here; the engine's times are probed
through its API (a few greedy requests, ~1-5 s) and fitted (timing/remote.py). The remote
engine batches and offloads on its own side, so the scheduler's consolidation, continuous
batching and the offload executor are refused with the reason.
"""

import random

from timebill_ros.engine.remote import client
from timebill_ros.engine.remote.model import RemoteModel
from timebill_ros.predictors import make_predictor
from timebill_ros.server.remote_runner import RemoteRunner
from timebill_ros.server.service import TimeBillService
from timebill_ros.timing.remote import fit_probes, RemoteTimeModel

PROBE_MAX_TOKENS = 32           # tokens each probe asks for
PROBE_LONG_TOKENS = 1024        # the long probes' prompt, tokens (at most a third of the context)
PROBE_WORDS = ('dock', 'shelf', 'pallet', 'door', 'charger', 'ramp', 'aisle', 'crate')


def check_remote_config(config):
    """Raise ValueError for what the remote backend cannot do, naming the parameter."""
    refused = [(config.scheduler.consolidation, 'scheduler.consolidation'),
               (config.scheduler.continuous, 'scheduler.continuous'),
               (config.offload.enabled, 'offload.enabled')]
    for is_set, name in refused:
        if is_set:
            raise ValueError(f'{name} is true, but engine.backend openai leaves batching and '
                             'placement to the remote engine: set it false')


def build_remote_service(config, log=print, fallback=None):
    """Return the TimeBillService of a remote engine (not yet started).

    fallback: the local JobRunner goals fall back to (``engine.remote_fallback``), or None.
    RuntimeError when the engine cannot be reached or named: the node then fails to
    configure with that message, rather than start without a time model.
    """
    check_remote_config(config)
    engine = config.engine
    endpoint = client.Endpoint.parse(engine.remote_url)
    name = engine.remote_model or _first_model(endpoint, engine.remote_connect_timeout_s)
    log(f'remote engine: {engine.remote_url}, model {name!r} ({engine.remote_api} API)')
    model = RemoteModel.load(engine, name)
    log(f'remote engine: tokenizer of {model.model_key}, context {model.context_tokens} tokens')
    runner = RemoteRunner(model, None, None, config, endpoint)  # the probes need neither
    coefficients = fit_probes(probe_engine(runner, log))
    time_model = RemoteTimeModel(coefficients, config.timing.online_settings())
    # The RLP compresses long prompts against the engine's first-token time (Eq. 4a's role).
    predictor = make_predictor(config.predictor, model.model_key, time_model.prefill_s,
                               engine.model_cache_dir or None, log=log)
    runner.predictor, runner.time_model = predictor, time_model
    runner.fallback = fallback
    log(f'remote time model: first token {coefficients.first_token_s * 1e3:.1f} ms + '
        f'{coefficients.prefill_token_s * 1e6:.1f} us/uncached prompt token; each further '
        f'token {coefficients.step_s * 1e3:.2f} ms + {coefficients.step_kv_token_s * 1e6:.2f} '
        'us/token before it')
    return TimeBillService(config, model, predictor, time_model, log=log, state_path=None,
                           runner=runner)


def _first_model(endpoint, timeout_s):
    """Return the first model id of the server's /models (RuntimeError if none or down)."""
    try:
        models = client.list_models(endpoint, timeout_s)
    except client.RemoteError as exc:
        raise RuntimeError(f'engine.remote_url: cannot list the models: {exc}') from exc
    if not models:
        raise RuntimeError('engine.remote_url: the server lists no models; set '
                           'engine.remote_model')
    return models[0]


def probe_texts(tokenizer, n_long, seed=0):
    """Return the probe prompts: (short fresh, long fresh, the long again, long fresh).

    Each fresh one starts with words no other probe starts with, so the engine holds none
    of it; the repeat finds all of it held.
    """
    rng = random.Random(seed)

    def fresh(n_tokens):
        words, text = [], ''
        while len(tokenizer(text, add_special_tokens=False)['input_ids']) < n_tokens:
            words.append(f'{rng.choice(PROBE_WORDS)} {rng.randrange(1000)}')
            text = ', '.join(words)
        return f'Inventory: {text}. Describe the inventory.'

    long_text = fresh(n_long)
    return [fresh(16), long_text, long_text, fresh(n_long // 2)]


def probe_engine(runner, log=print):
    """Send the probes (:func:`probe_texts`) and return their ProbePoints.

    RuntimeError naming the failure when a probe fails.
    """
    model = runner.engine
    n_long = min(PROBE_LONG_TOKENS, model.context_tokens // 3)
    points = []
    for index, text in enumerate(probe_texts(model.tokenizer, n_long)):
        try:
            point = runner.probe(text, PROBE_MAX_TOKENS)
        except client.RemoteError as exc:
            raise RuntimeError(f'remote engine probe {index + 1} failed: {exc}') from exc
        log(f'remote probe {index + 1}: N_x {point.n_x} ({point.n_cached} held), first token '
            f'{point.first_token_s * 1e3:.0f} ms, {point.n_steps} more in '
            f'{point.decode_s * 1e3:.0f} ms')
        points.append(point)
    return points
