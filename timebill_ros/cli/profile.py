"""``timebill profile``: measure the engine, fit Eq. 4, save the calibration."""


def cmd_profile(args, ros_args):
    """Profile prefill and decode-step times, fit Eq. 4, print the report, save the YAML."""
    from timebill_ros.engine import LlmEngine
    from timebill_ros.params import load_config
    from timebill_ros.server.backends.local import resolved_engine
    from timebill_ros.timing.few_shot import few_shot_profile
    from timebill_ros.timing.profiler import ProfileGrid, format_report, profile
    from timebill_ros.timing.model import default_calibration_path
    config = load_config(args.params, args.set)
    engine = LlmEngine.load(config.engine, config.eviction)
    config = resolved_engine(config, engine)
    limit = args.time_limit or None
    if args.few_shot:
        calibration = few_shot_profile(engine, engine_config=config.engine, time_limit_s=limit,
                                       max_tokens=min(args.max_tokens, 2048), progress=print)
    else:
        if args.quick:
            grid = ProfileGrid.startup_grid()
        else:
            grid = ProfileGrid.full_grid(engine.context_tokens, max_tokens=args.max_tokens)
        calibration = profile(engine, grid, time_limit_s=limit, progress=print)
    if not args.no_batch and engine.forward.max_batch > 1:
        import dataclasses
        from timebill_ros.timing.batch import probe_batches
        calibration = dataclasses.replace(
            calibration, batch_points=tuple(probe_batches(engine, progress=print)))
    print(format_report(calibration))
    # The calibration's own key (profiler.key_fields): the one the server looks up.
    out = args.out or default_calibration_path(calibration.key)
    calibration.save(out)
    print(f'saved {out}')
    return 0


def add_parser(sub):
    """Add the ``profile`` command to ``sub``."""
    prof = sub.add_parser('profile', help=cmd_profile.__doc__)
    prof.add_argument('--params', help='ROS 2 params YAML for the engine settings')
    prof.add_argument('--set', action='append', default=[], metavar='GROUP.FIELD=VALUE')
    prof.add_argument('--out', help='calibration YAML (default: the per-user cache entry)')
    mode = prof.add_mutually_exclusive_group()
    mode.add_argument('--quick', action='store_true', help='the small start-up grid')
    mode.add_argument('--few-shot', action='store_true',
                      help='five probes, Eq. 4 fitted to them (SimFLi budget; ~15 s on CPU)')
    prof.add_argument('--max-tokens', type=int, default=4096,
                      help='largest N_x / N_kv (few-shot: at most 2048)')
    prof.add_argument('--time-limit', type=float, default=0.0,
                      help='seconds; skip measurements that would exceed it (0 = none)')
    prof.add_argument('--no-batch', action='store_true',
                      help='skip the batched-decoding probes (B = 1, 2, 4, 8)')
    prof.set_defaults(func=cmd_profile)
