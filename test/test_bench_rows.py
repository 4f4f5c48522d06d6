"""The benchmarks' run files: measured once and saved, or read back for a report."""

import json

from timebill_ros.bench.rows import saved_or_measured


def test_a_run_is_saved_with_its_header_and_read_back_unchanged(tmp_path):
    path = tmp_path / 'out' / 'run.json'
    calls = []

    def measure():
        calls.append(1)
        return {'rows': [{'seconds': [0.5, 0.25]}]}
    data = saved_or_measured(path, False, measure, 'python benchmarks/x.py A')
    assert calls == [1] and data['rows'] == [{'seconds': [0.5, 0.25]}]
    assert data['command'] == 'python benchmarks/x.py A' and data['host'] and data['date']
    assert json.loads(path.read_text()) == data
    assert saved_or_measured(path, True, measure, 'ignored') == data
    assert calls == [1]  # a report measures nothing
