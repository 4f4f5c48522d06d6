"""Is t_Predict hidden behind the prefill? Measured the way the server runs both.

For prompts of growing length N_x the RLP runs on a worker thread while the engine prefills
(as JobRunner does); the table gives t_prefill alone and with the predictor running beside it
(on a CPU-only machine both share the cores), t_Predict, N_p (after compression) and the
overhang max(0, end of prediction - end of prefill), which is what enters Eq. 11.
"""

import concurrent.futures
import time
from typing import List

from timebill_ros import prompts
from timebill_ros.engine import stopping

LOG_LINES = (1, 4, 10, 25, 50, 100, 200)  # robot-log sizes, ~18 tokens a line
SHORT_PROMPTS = ('Stop.', 'Is the door open?')  # the shortest goals a planner sends
REPEATS = 3


def measure_overlap(engine, predictor, n_max: int = 128, repeats: int = REPEATS,
                    log_lines=LOG_LINES) -> List[dict]:
    """Return one row per prompt length: medians over ``repeats`` runs of each kind.

    Overhang and t_Predict come from the run with the median overhang; t_prefill alone and
    with the predictor are medians of their own.
    """
    rows = []
    texts = list(SHORT_PROMPTS) + [prompts.long_prompt(n, seed=n) for n in log_lines]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        for prompt in texts:
            ids = engine.encode(prompt)
            runs = [_one_run(engine, predictor, pool, prompt, ids, n_max)
                    for _ in range(repeats)]
            alone = sorted(engine.prefill(ids, stopping.StopCriteria([])).prefill_s
                           for _ in range(repeats))
            runs.sort(key=lambda r: r['overhang_s'])
            median = runs[len(runs) // 2]
            median['prefill_alone_s'] = alone[len(alone) // 2]
            median['prefill_s'] = sorted(r['prefill_s'] for r in runs)[len(runs) // 2]
            rows.append({'n_x': len(ids), 'n_p': min(len(ids), predictor.input_cap(len(ids))),
                         **median,
                         'hidden_runs': sum(r['overhang_s'] == 0.0 for r in runs),
                         'repeats': repeats})
    finally:
        pool.shutdown(wait=True)
    return rows


def _one_run(engine, predictor, pool, prompt, ids, n_max):
    def predict():
        start = time.perf_counter()
        predictor.predict(prompt, ids, n_max)
        return start, time.perf_counter()

    future = pool.submit(predict)
    state = engine.prefill(ids, stopping.StopCriteria([]))
    prefill_end = time.perf_counter()
    start, end = future.result()
    return {'prefill_s': state.prefill_s, 'predict_s': end - start,
            'overhang_s': max(0.0, end - prefill_end)}


def format_overlap(rows) -> str:
    """Return the Markdown table of :func:`measure_overlap` rows."""
    lines = ['| N_x (tokens) | N_p (tokens) | t_prefill alone (s) | t_prefill with predictor (s) '
             '| t_Predict (s) | overhang (s) | hidden runs |', '|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(f"| {r['n_x']} | {r['n_p']} | {r['prefill_alone_s']:.3f} | "
                     f"{r['prefill_s']:.3f} | "
                     f"{r['predict_s']:.3f} | {r['overhang_s']:.3f} | "
                     f"{r['hidden_runs']}/{r['repeats']} |")
    return '\n'.join(lines)
