"""``timebill serve`` and ``timebill send``: run the node, send it one goal."""

import sys

from timebill_ros.server.overrun import POLICY_CODES


def cmd_serve(args, ros_args):
    """Start the timebill node (the same node launch/llm.launch.py starts)."""
    from timebill_ros.server.factory import build_service
    from timebill_ros.ros.node import TimeBillNode
    from timebill_ros.ros.spin import spin
    if args.params:
        ros_args = (ros_args or ['--ros-args']) + ['--params-file', args.params]
    spin(lambda: TimeBillNode(build_service, node_name=args.node_name, freeze_heap=True),
         args=[sys.argv[0]] + ros_args)
    return 0


def cmd_send(args, ros_args):
    """Send one goal and print feedback and the result."""
    from timebill_ros.ros.client import TimebillClient
    from timebill_ros.server.status import ERROR_NAMES, POLICY_DEFAULT
    policy = POLICY_CODES.get(args.policy, POLICY_DEFAULT)
    try:
        llm = TimebillClient(args.action, wait_s=args.wait)
    except TimeoutError as exc:
        print(exc, file=sys.stderr)
        return 2
    with llm:
        result = llm.ask(args.prompt, args.budget, max_new_tokens=args.max_new_tokens,
                         policy=policy, system_prompt=args.system,
                         on_feedback=lambda fb: print(fb.text, end='', flush=True))
    print()
    for field in ('status', 'error_code', 'message', 'finish_reason', 'response',
                  'prompt_tokens', 'response_tokens', 'predicted_tokens', 'pessimistic_tokens',
                  'eviction_ratio', 'deadline_met', 'truncated', 'infeasible', 'predictor'):
        value = getattr(result, field)
        if field == 'error_code':
            value = f'{value} ({ERROR_NAMES.get(value, "?")})'
        print(f'{field}: {value}')
    return 0 if result.status == result.COMPLETED else 1


def add_parser(sub):
    """Add the ``serve`` and ``send`` commands to ``sub``."""
    serve = sub.add_parser('serve', help=cmd_serve.__doc__)
    serve.add_argument('--params', help='ROS 2 params YAML (e.g. config/llm.yaml)')
    serve.add_argument('--node-name', default='timebill')
    serve.set_defaults(func=cmd_serve)
    send = sub.add_parser('send', help=cmd_send.__doc__)
    send.add_argument('prompt')
    send.add_argument('--budget', type=float, default=5.0, help='time budget, seconds')
    send.add_argument('--max-new-tokens', type=int, default=0)
    send.add_argument('--policy', choices=('default',) + tuple(POLICY_CODES),
                      default='default')
    send.add_argument('--system', default='')
    send.add_argument('--action', default='/timebill/instruct')
    send.add_argument('--wait', type=float, default=30.0, help='seconds to wait for the server')
    send.set_defaults(func=cmd_send)
