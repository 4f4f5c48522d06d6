"""The ``timebill`` command: one module per verb group (offline side; never run by the node).

serve / send (``server``), monitor / record (``monitor``), plot, profile, demo, bench /
enginebench / schedbench (``bench``), soak, predictor, latency, params-doc (``params_doc``).
"""

import argparse
import signal
import sys


def _split_ros_args(argv):
    """Split argv at ``--ros-args``: (ours, ros args including the marker)."""
    if '--ros-args' in argv:
        i = argv.index('--ros-args')
        return argv[:i], argv[i:]
    return argv, []


def build_parser():
    """Return the argparse parser of the ``timebill`` command."""
    from timebill_ros.cli import (bench, demo, latency, monitor, params_doc, plot, predictor,
                                  profile, server, soak, study)
    parser = argparse.ArgumentParser(
        prog='timebill', description='timebill_ros: serve, send, monitor, record, plot, '
        'profile, demo, bench, enginebench, schedbench, soak, study, predictor, latency, '
        'params-doc.')
    sub = parser.add_subparsers(dest='command', required=True)
    for module in (server, monitor, plot, profile, demo, bench, soak, study, predictor, latency,
                   params_doc):
        module.add_parser(sub)
    return parser


def exit_on_sigterm():
    """Make SIGTERM raise SystemExit(143) in the main thread (as Ctrl-C raises).

    By default SIGTERM ends the process at once, past every ``finally``: a benchmark stopped
    so left its ``timebill serve`` and llama.cpp server processes running.
    """
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def main(argv=None):
    """Entry point of the ``timebill`` console script.

    Every verb but ``serve`` (whose spin loop ends the node cleanly on SIGINT and SIGTERM,
    ros/spin.py) unwinds on SIGTERM as on Ctrl-C, stopping the processes it started.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, ros_args = _split_ros_args(argv)
    args = build_parser().parse_args(ours)
    if args.command != 'serve':
        exit_on_sigterm()
    return args.func(args, ros_args)
