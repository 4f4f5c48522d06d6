"""An Instruct result as plain values: the one converter behind the benchmarks' rows."""


def result_fields(result):
    """Return the fields of an ``Instruct.Result`` as a dict of plain Python values.

    Codes and counts as int, flags as bool, texts as str, durations in seconds under the
    field's name with ``_s`` for ``_time`` (``predicted_wcet_s`` for ``predicted_wcet``);
    ``status_name`` is the status code's name (the code itself when unknown). Each benchmark
    picks its columns from it and adds its own.
    """
    from timebill_ros.ros.conversions import duration_to_s
    from timebill_ros.server.status import STATUS_NAMES
    return {'status': int(result.status),
            'status_name': STATUS_NAMES.get(result.status, str(result.status)),
            'deadline_met': bool(result.deadline_met),
            'message': str(result.message), 'response': str(result.response),
            'truncated': bool(result.truncated), 'infeasible': bool(result.infeasible),
            'prompt_tokens': int(result.prompt_tokens),
            'response_tokens': int(result.response_tokens),
            'predicted_tokens': int(result.predicted_tokens),
            'pessimistic_tokens': int(result.pessimistic_tokens),
            'uncertainty_tokens': int(result.uncertainty_tokens),
            'eviction_ratio': float(result.eviction_ratio),
            'predictor': str(result.predictor), 'executor': str(result.executor),
            'batch_size': int(result.batch_size),
            'predicted_wcet_s': duration_to_s(result.predicted_wcet),
            'min_time_s': duration_to_s(result.min_time),
            'total_s': duration_to_s(result.total_time),
            'queue_s': duration_to_s(result.queue_time),
            'schedule_s': duration_to_s(result.schedule_time),
            'predict_s': duration_to_s(result.predict_time),
            'prefill_s': duration_to_s(result.prefill_time),
            'decode_s': duration_to_s(result.decode_time),
            'checkpoint_tokens': [int(n) for n in result.checkpoint_tokens],
            'checkpoint_ratios': [float(a) for a in result.checkpoint_ratios],
            'checkpoint_wcet_s': [float(w) for w in result.checkpoint_wcet_s],
            'rest_error_tokens': int(result.rest_error_tokens)}


def pick(fields, names):
    """Return the entries of ``fields`` named in ``names``, in that order."""
    return {name: fields[name] for name in names}


def write_table(md_path, lines, rows):
    """Write ``lines`` (Markdown) to ``md_path`` and ``rows`` beside it as JSON; print them.

    The JSON file has the Markdown file's name with ``.json``; folders are made as needed.
    """
    import json
    import os
    os.makedirs(os.path.dirname(md_path) or '.', exist_ok=True)
    with open(md_path, 'w', encoding='utf-8') as stream:
        stream.write('\n'.join(lines) + '\n')
    with open(os.path.splitext(md_path)[0] + '.json', 'w', encoding='utf-8') as stream:
        json.dump(rows, stream, indent=1)
    print('\n'.join(lines))


def saved_or_measured(json_path, report, measure, command):
    """Return a run's data: the saved JSON (``report``) or ``measure()``'s, saved there.

    measure: () -> dict of the run's rows; the saved data adds ``command``, the host, its
    machine and the UTC date. Folders are made as needed.
    """
    import datetime
    import json
    import pathlib
    import platform
    json_path = pathlib.Path(json_path)
    if report:
        return json.loads(json_path.read_text())
    data = dict(command=command, host=platform.node(), machine=platform.machine(),
                date=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
                **measure())
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=1))
    return data


def add_rows_arguments(parser, json_path):
    """Add ``--json`` (the run's rows, default ``json_path``), ``--report`` and ``--out``.

    What a study that keeps its rows beside its table takes (:func:`saved_or_measured`).
    """
    parser.add_argument('--json', default=json_path)
    parser.add_argument('--report', action='store_true',
                        help='rebuild the table from --json instead of measuring')
    parser.add_argument('--out', default='')
