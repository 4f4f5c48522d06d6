#!/usr/bin/env python3
"""Ask the timebill server a few questions with deadlines, as a planner would.

Start the server first (``timebill serve`` or ``ros2 launch timebill_ros llm.launch.py``),
then ``python examples/ask.py [--action /timebill/instruct]``.
"""

import argparse
import json

from timebill_ros.action import Instruct
from timebill_ros.ros.client import TimebillClient

NEXT_STEP = json.dumps({
    'type': 'object', 'properties': {
        'action': {'enum': ['move', 'pick', 'place', 'wait']},
        'target': {'type': 'string', 'maxLength': 40}},
    'required': ['action', 'target']})


def main():
    """Send three goals: a plain question, a JSON answer, and one that cannot fit."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--action', default='/timebill/instruct')
    args = parser.parse_args()
    with TimebillClient(args.action) as llm:
        result = llm.ask('Which room is the charging dock usually in?', budget_s=3.0,
                         max_new_tokens=48)
        report('question', result)
        result = llm.ask('The cup is on the table. What should the robot do next?',
                         budget_s=5.0, max_new_tokens=64, json_schema=NEXT_STEP)
        report('json step', result)
        if result.status == Instruct.Result.COMPLETED and result.finish_reason == 'eos':
            print('  parsed:', json.loads(result.response))
        report('impossible', llm.ask('Write a long essay on logistics.', budget_s=0.001))
        pending = llm.send('Describe the warehouse in detail.', budget_s=10.0)
        pending.cancel()
        report('canceled', pending.result())


def report(label, result):
    """Print how a goal ended: status, error code, finish reason, timing, the answer."""
    status = {getattr(Instruct.Result, name): name for name in
              ('COMPLETED', 'KILLED', 'SKIPPED', 'REJECTED', 'CANCELED', 'FAILED')}
    seconds = result.total_time.sec + result.total_time.nanosec * 1e-9
    print(f'{label}: {status.get(result.status)} error_code={result.error_code} '
          f'finish={result.finish_reason} total={seconds:.2f} s on_time={result.deadline_met}')
    print(f'  {result.message}')
    if result.response:
        print(f'  {result.response!r}')


if __name__ == '__main__':
    main()
