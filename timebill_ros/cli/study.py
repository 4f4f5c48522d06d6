"""``timebill study NAME [flags]``: run one of the studies behind the docs' figures."""

import argparse


def cmd_study(args, ros_args):
    """Run study ``args.name`` with its own flags, or list the studies."""
    from timebill_ros.bench import studies
    if args.list or not args.name:
        for name in studies.names():
            print(f'{name:24s} {studies.describe(name)}')
        return 0
    return studies.run(args.name, args.flags)


def add_parser(sub):
    """Add the ``study`` command to ``sub``."""
    parser = sub.add_parser('study', help='run a study behind a figure of the docs '
                            '(timebill study --list; timebill study NAME --help)')
    parser.add_argument('--list', action='store_true', help='list the studies and exit')
    parser.add_argument('name', nargs='?', default='', help='the study (timebill study --list)')
    parser.add_argument('flags', nargs=argparse.REMAINDER, help="the study's own flags")
    parser.set_defaults(func=cmd_study)
