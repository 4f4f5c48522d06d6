"""The scheduling methods compared: each a name and the server parameters that make it."""

# (name, server parameters). A method whose parameters config_from_flat refuses is skipped.
METHODS = (('fifo', {'scheduler.policy': 'fifo'}),
           ('edf', {'scheduler.policy': 'edf'}),
           ('luf', {'scheduler.policy': 'luf'}),
           ('muf', {'scheduler.policy': 'muf'}),
           ('slack', {'scheduler.policy': 'slack'}),
           ('up', {'scheduler.policy': 'up'}),
           # Control for up+offload: one executor with the thread count each of those has.
           ('up-1thread', {'scheduler.policy': 'up', 'engine.threads': 1}),
           # Both executors on this CPU: the primary gets 1 thread, the offload engine 1.
           ('up+offload', {'scheduler.policy': 'up', 'offload.enabled': True,
                           'engine.threads': 1, 'offload.threads': 1}),
           # Consolidation (Sec. IV-C): similar-length goals decode as one batch.
           ('up+consolidation', {'scheduler.policy': 'up', 'scheduler.consolidation': True}),
           # RT-LM as a whole: up + consolidation + offload (1 + 1 threads as above).
           ('rt-lm', {'scheduler.policy': 'up', 'scheduler.consolidation': True,
                      'offload.enabled': True, 'engine.threads': 1, 'offload.threads': 1}),
           # Batching without priorities: the receipt-order goal plus whoever is similar.
           ('fifo+consolidation', {'scheduler.policy': 'fifo',
                                   'scheduler.consolidation': True}),
           # The strong baseline a vLLM or llama.cpp user expects: receipt order, and waiting
           # goals join the decoding batch between steps.
           ('fifo+continuous', {'scheduler.policy': 'fifo', 'scheduler.continuous': True}))
# Run instead when a method's own parameters are refused: a server without scheduler.policy
# runs its goals in order of receipt.
FALLBACK_PARAMS = {'fifo': {}}


def selected_methods(names=None):
    """Return the METHODS entries named in ``names`` (iterable or comma string; all if empty).

    ``up@ALPHA`` (ALPHA a number >= 0) is ``up`` with ``scheduler.up_alpha`` ALPHA, for
    sweeping Eq. 3's alpha (RT-LM Fig. 13a); these follow the named METHODS, in given order.
    """
    if not names:
        return list(METHODS)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(',') if n.strip()]
    known = [m[0] for m in METHODS]
    sweeps = [n for n in names if n.startswith('up@')]
    unknown = sorted(set(names) - set(known) - set(sweeps))
    if unknown:
        raise ValueError(f'unknown method(s) {unknown}; known: {known} and up@ALPHA')
    return [m for m in METHODS if m[0] in names] + [_alpha_method(n) for n in sweeps]


def _alpha_method(name):
    """Return the METHODS-style entry of ``up@ALPHA``; ALPHA is checked as the server checks it."""
    from timebill_ros.config import SchedulerConfig
    try:
        alpha = float(name[len('up@'):])
        SchedulerConfig(policy='up', up_alpha=alpha)
    except ValueError as exc:
        raise ValueError(f'{name!r}: ALPHA of up@ALPHA must be a finite number >= 0 '
                         f'({exc})') from None
    return name, {'scheduler.policy': 'up', 'scheduler.up_alpha': alpha}


def method_params(name, flat, check=None):
    """Return (server parameters, note) of a method, or (None, why) when they are refused.

    check(flat) raises ValueError / TypeError on parameters the server does not know
    (default: params.config_from_flat). A refused ``fifo`` falls back to FALLBACK_PARAMS.
    """
    if check is None:
        from timebill_ros.params import config_from_flat as check
    try:
        check(flat)
        return flat, ''
    except (ValueError, TypeError) as exc:
        why = str(exc)
    fallback = FALLBACK_PARAMS.get(name)
    if fallback is not None:
        try:
            check(fallback)
            return fallback, f'{why}; ran the server default (order of receipt) instead'
        except (ValueError, TypeError):
            pass
    return None, why
