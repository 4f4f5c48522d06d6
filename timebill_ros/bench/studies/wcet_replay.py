"""Replay a drift run through the online time model, offline, to compare estimator settings.

    timebill study wcet_replay RUN.json CALIBRATION.yaml [--warm-up P,D] [--set k=v ...]

RUN.json is a ``wcet_drift.py`` output. Goals are replayed in the order they ran: before each
goal its t^_WCET is computed as the server computes it (WORST prefill + WORST decoding of N^_W
tokens at the goal's alpha; the predictor overhang is left out: it was zero on these goals),
then the goal's measured prefill and decoding feed the model. ``--warm-up`` gives the
start-up warm-up's measured/calibrated ratios (prefill, decode; from the server log) as the
first observations. ``--set`` overrides OnlineSettings fields (e.g. ``--set speed_gain=0.5``).
Prints exceedances and mean t^_WCET / t_exec. Used to choose the estimator on one run (dev),
before a second drift run on other prompts measures it (see docs/deadlines.md).
"""

import argparse
import json
import sys


def replay(rows, coefficients, settings, warm_up=None):
    """Return [(exec_s, wcet_s)] for the COMPLETED rows, replaying the model over them."""
    from timebill_ros.timing.online import WORST, TimeModel
    model = TimeModel(coefficients, settings)
    if warm_up:
        model.observe_prefill(256, coefficients.prefill_s(256) * warm_up[0])
        model.observe_decode(128, 8, warm_up[1] * (8 * (coefficients.p * 128 + coefficients.q)
                                                   + coefficients.p * 28))
    out = []
    for row in rows:
        if row['status'] != 1:
            continue
        n_x, alpha, n_w = row['n_x'], row['alpha'], max(1, row['n_w'])
        wcet = model.prefill_s(n_x, WORST) + model.decode_s(n_x, alpha, n_w, WORST)
        out.append((row['exec_s'], wcet, row['wcet_self_s']))
        model.observe_prefill(n_x, row['prefill_s'])
        n_kv = round((1 - alpha) * n_x)
        model.observe_decode(n_kv, max(0, row['n'] - 1), row['decode_s'])
    return out


def _value(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {'true': True, 'false': False}.get(text.lower(), text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('run')
    parser.add_argument('calibration')
    parser.add_argument('--warm-up', default='', help='prefill,decode ratios, e.g. 1.16,0.67')
    parser.add_argument('--set', action='append', default=[], metavar='FIELD=VALUE')
    args = parser.parse_args(argv)
    from timebill_ros.timing.model import Calibration
    from timebill_ros.config import OnlineSettings
    rows = json.loads(open(args.run, encoding='utf-8').read())['goals']
    calibration = Calibration.load(args.calibration)
    fields = dict(item.split('=', 1) for item in args.set)
    settings = OnlineSettings(**{k: _value(v) for k, v in fields.items()})
    warm_up = tuple(float(x) for x in args.warm_up.split(',')) if args.warm_up else None
    pairs = replay(rows, calibration.coefficients, settings, warm_up)
    over = sum(e > w for e, w, _ in pairs)
    ratio = sum(w / e for e, w, _ in pairs) / len(pairs)
    drift = max(abs(w - s) / s for _, w, s in pairs)
    print(f'{settings}: {over}/{len(pairs)} over t^_WCET ({over / len(pairs):.1%}), '
          f'mean WCET/exec {ratio:.2f}; largest relative gap to the WCETs the server '
          f'reported: {drift:.1%}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
