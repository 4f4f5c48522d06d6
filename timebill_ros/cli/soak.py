"""``timebill soak``: the node under hours of seeded mixed load, recorded per minute."""


def cmd_soak(args, ros_args):
    """Run the node under seeded mixed load from another process; per-minute table and PNG."""
    from timebill_ros.bench.soak import run_soak
    return run_soak(args)


def add_parser(sub):
    """Add the ``soak`` command to ``sub``."""
    from timebill_ros.bench import soak
    parser = sub.add_parser('soak', help=cmd_soak.__doc__)
    soak.add_arguments(parser)
    parser.set_defaults(func=cmd_soak)
