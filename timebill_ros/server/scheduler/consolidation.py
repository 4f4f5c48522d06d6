"""RT-LM's consolidation (Sec. IV-C, Alg. 1 lines 14-26): which waiting goals decode together.

Alg. 1 gathers b x C_f goals from the priority queue, sorts them by uncertainty u_J and cuts
the sorted run into batches wherever a goal's u_J exceeds lambda x the one before it or C_f
goals are reached. A server answering goals as they come must also keep the policy's choice
first, so here the batch is the cut that holds the highest-priority goal: starting from it,
the batch grows to its neighbours in u_J order (the higher-priority neighbour first) while
each step of u_J stays within the ratio and the batch holds fewer than C_f goals. Goals that
do not join stay queued. u_J below one token counts as one (a ratio to 0 is undefined).
"""

import math


def cut_batch(jobs, now_s, policy, batch_size, b, length_ratio):
    """Return the indices into ``jobs`` of the batch to run next, highest priority first.

    jobs: the waiting goals an executor may take (non-empty); each has
    ``uncertainty_tokens`` (u_J, tokens) and what ``policy`` (a SchedulerPolicy) needs.
    batch_size: C_f (>= 1). b: candidates = the ceil(b x C_f) goals of highest priority.
    length_ratio: lambda, the largest u_J ratio between neighbours in a batch.
    """
    if not jobs:
        raise ValueError('cut_batch needs at least one job')
    order = sorted(range(len(jobs)),
                   key=lambda i: (policy.key(jobs[i], now_s), jobs[i].received_s, i))
    rank = {index: position for position, index in enumerate(order)}
    candidates = order[:max(1, math.ceil(b * batch_size))]
    by_length = sorted(candidates, key=lambda i: (_tokens(jobs[i]), rank[i]))
    low = high = by_length.index(order[0])
    while high - low + 1 < batch_size:
        options = []
        if low > 0 and _close(jobs[by_length[low - 1]], jobs[by_length[low]], length_ratio):
            options.append((rank[by_length[low - 1]], -1))
        if (high + 1 < len(by_length)
                and _close(jobs[by_length[high]], jobs[by_length[high + 1]], length_ratio)):
            options.append((rank[by_length[high + 1]], 1))
        if not options:
            break
        _, side = min(options)
        if side < 0:
            low -= 1
        else:
            high += 1
    return sorted(by_length[low:high + 1], key=rank.__getitem__)


def _tokens(job):
    return max(1, job.uncertainty_tokens)


def _close(shorter, longer, length_ratio):
    """Return True if ``longer``'s u_J is within ``length_ratio`` x ``shorter``'s."""
    return _tokens(longer) <= length_ratio * _tokens(shorter)


def join_batch(jobs, now_s, policy, room, members, length_ratio=None):
    """Return the indices into ``jobs`` that join a decoding batch now, priority first.

    Continuous batching: at most ``room`` waiting goals join between steps. With
    ``length_ratio`` (consolidation) only goals whose u_J is within that ratio of some
    member's (``members``: the goals decoding) join; None: any goal, in priority order.
    """
    order = sorted(range(len(jobs)),
                   key=lambda i: (policy.key(jobs[i], now_s), jobs[i].received_s, i))
    if length_ratio is not None:
        order = [i for i in order
                 if any(_close(*sorted((jobs[i], member), key=_tokens), length_ratio)
                        for member in members)]
    return order[:max(0, room)]


def keep_on_time(jobs, now_s, prefill_s, decode_s, step_scale):
    """Return the indices of ``jobs`` that may decode together without making a goal late.

    jobs: a cut batch, highest priority first; the first always stays (it runs, alone if
    need be). Then each next goal joins while every member, the newcomer included, is still
    expected to end by its deadline: now_s + the members' prefills (all run before the
    batch decodes) + step_scale(B) x its decoding alone <= its ``deadline_s``. A goal that
    would end late in the batch stays queued (run later, alone or in another batch):
    consolidation must not turn a goal that fits alone into a miss. Goals already late
    alone do not stop others from joining.
    prefill_s(job), decode_s(job): seconds alone (expected, its predicted answer);
    step_scale(B): a goal's decoding step in a batch of B over alone (timing.batch).
    """
    if not jobs:
        raise ValueError('keep_on_time needs at least one job')
    alone = {i: now_s + prefill_s(job) + decode_s(job) <= job.deadline_s
             for i, job in enumerate(jobs)}
    kept = [0]
    for i in range(1, len(jobs)):
        trial = kept + [i]
        start_s = now_s + sum(prefill_s(jobs[k]) for k in trial)
        scale = step_scale(len(trial))
        if all(start_s + scale * decode_s(jobs[k]) <= jobs[k].deadline_s
               for k in trial if alone[k]):
            kept = trial
    return kept
