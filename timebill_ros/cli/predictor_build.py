"""``timebill predictor build``: a model's own length predictors, from nothing to the cache.

For the embedded model the lengths are committed (``data/rlp/lengths_1024_guard.jsonl``); for
any other model (``--model FILE``) the build first collects that model's own answer lengths on
the corpus, with the loop guard on, into the cache (resumable), and the pooled prefill states
the readout trains on with them. Then it trains and exports the RLP, the prefill readout and
(where the collection kept the answers' token ids) the decode readout beside the calibration,
keyed on the model (its file's content for a GGUF), where the node looks for them. Each step
runs in a process of its own; the output goes to the terminal and to
``<cache>/rlp/<model key>__build.log``.
"""

import json
import os
import pathlib
import subprocess
import sys
import time

from timebill_ros.predictors.contract import predictor_files

DEFAULT_LENGTHS = 'data/rlp/lengths_1024_guard.jsonl'  # the embedded model's, loop guard on
# The embedded model's answers' token ids, of the quick 240-prompt subset only (the decode
# readout's training input; the whole corpus's ids would add ~2 MB to git). Made by `timebill
# predictor collect --prompts 240 --out data/rlp/answer_ids_240.jsonl`: the same greedy answers
# as DEFAULT_LENGTHS (every length equal, checked when the decode readout merges them).
DEFAULT_ANSWER_IDS = 'data/rlp/answer_ids_240.jsonl'


def lengths_path(config, given=None) -> pathlib.Path:
    """Return the lengths JSONL of ``config``'s model: ``given``, else its default.

    The embedded model's are committed (DEFAULT_LENGTHS); another model's are collected into
    ``<cache>/rlp/<model key>__lengths.jsonl``.
    """
    from timebill_ros.engine import model_source
    if given:
        return pathlib.Path(given)
    if not config.engine.model_path:
        return pathlib.Path(DEFAULT_LENGTHS)
    return (model_source.cache_root(config.engine) / 'rlp'
            / f'{model_source.model_key(config.engine)}__lengths.jsonl')


def answer_ids_path(config, given=None, lengths_given=None):
    """Return the file the decode readout takes answer ids from beside the lengths, or None.

    ``given`` (``--answer-ids``), else DEFAULT_ANSWER_IDS for the embedded model read from its
    committed lengths (which keep no ids); a collected model's lengths keep their own.
    """
    if given:
        return pathlib.Path(given)
    if config.engine.model_path or lengths_given:
        return None
    return pathlib.Path(DEFAULT_ANSWER_IDS)


def log_path(config) -> pathlib.Path:
    """Return the build log of ``config``'s model, beside its predictor files."""
    from timebill_ros.engine import model_source
    return (predictor_files(config)['RLP'].parent
            / f'{model_source.model_key(config.engine)}__build.log')


def built_on(path) -> int:
    """Return the training prompts the predictor file at ``path`` was trained on.

    Read from the metadata beside it (``<file>.json``, ``train_prompts``). A file built before
    the count was stored counts as built on every prompt (``sys.maxsize``); a missing or
    unreadable file as built on none (0).
    """
    path = pathlib.Path(path)
    if not path.is_file():
        return 0
    try:
        meta = json.loads(path.with_suffix('.json').read_text())
    except (OSError, ValueError):
        return sys.maxsize
    value = meta.get('train_prompts') if isinstance(meta, dict) else None
    return int(value) if str(value or '').isdigit() else sys.maxsize


def build_steps(config, common, prompts=0):
    """Return the argv of each build step (``timebill predictor ...`` in this Python).

    common: the ``--params`` / ``--set`` / ``--model`` arguments every step gets. prompts:
    collect only this many prompts (a quick start, :func:`~timebill_ros.training.corpus.
    quick_subset`); 0 = the whole corpus. The embedded model's committed lengths are not
    collected again.
    """
    steps = []
    if config.engine.model_path or not lengths_path(config).is_file():
        steps.append(['collect', *(['--prompts', str(prompts)] if prompts else [])])
    steps += [['train', '--export', '--if-stale'], ['readout', '--export', '--if-stale'],
              ['decode-readout', '--export', '--if-stale']]
    return [[sys.executable, '-m', 'timebill_ros.cli', 'predictor', *step, *common]
            for step in steps]


NEEDED_STEPS = ('collect',)  # the steps after these cannot run without them


def run_steps(commands, log_file, out=sys.stdout, clock=time.monotonic,
              needed=NEEDED_STEPS) -> int:
    """Run ``commands`` in order, each line to ``out`` and ``log_file``; return the exit code.

    A failing step named in ``needed`` ends the build; another (the RLP, where transformers
    cannot read the file) is logged and the next step runs (the readout needs only the
    engine). Returns the first failing step's code (0: all ran); a summary line gives each
    step's minutes.
    """
    log_file = pathlib.Path(log_file)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    spent, failed = [], 0
    with open(log_file, 'a', encoding='utf-8') as log:
        def say(line):
            out.write(line)
            out.flush()
            log.write(line)
            log.flush()

        for index, command in enumerate(commands, 1):
            name = (command[command.index('predictor') + 1] if 'predictor' in command
                    else pathlib.Path(command[0]).name)
            say(f'--- step {index}/{len(commands)}: {name} '
                f'({time.strftime("%Y-%m-%d %H:%M:%S")})\n')
            start = clock()
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, bufsize=1, env=dict(os.environ))
            for line in proc.stdout:
                say(line)
            code = proc.wait()
            spent.append(f'{name} {(clock() - start) / 60:.1f} min')
            if code:
                say(f'--- {name} failed (exit code {code}); log: {log_file}\n')
                failed = failed or code
                if name in needed:
                    return failed
        say(f'--- {"built" if not failed else "ended"}: {", ".join(spent)}; log: {log_file}\n')
    return failed


def common_args(args):
    """Return the arguments that pick the params and the model, for each step."""
    common = ['--params', args.params] if args.params else []
    for item in args.set:
        common += ['--set', item]
    if getattr(args, 'model', None):
        common += ['--model', str(pathlib.Path(args.model).expanduser().resolve())]
    return common


def cmd_build(args, config):
    """Build the missing or quick-built RLP and readout (collecting lengths first if needed)."""
    common = common_args(args)
    if args.background:
        print(start_background_build(config, common, args.nice, args.prompts))
        return 0
    return run_steps(build_steps(config, common, args.prompts), log_path(config))


def start_background_build(config, common=(), nice=10, prompts=0):
    """Start building the missing RLP / readout in a niced process of its own; return a line.

    ``common``: the ``--params`` / ``--set`` / ``--model`` arguments the build steps get.
    Nothing starts when both files exist or a build is running (a lock file beside them); the
    process outlives the caller, its log is the build log (:func:`log_path`).
    """
    # The decode readout is not built here: it needs answers collected with their token ids.
    files = {name: path for name, path in predictor_files(config).items()
             if name in ('RLP', 'readout')}
    missing = [name for name, path in files.items() if not path.is_file()]
    if not missing:
        return f'predictors built: {", ".join(str(p) for p in files.values())}'
    log_file = log_path(config)
    lock_path = files['RLP'].parent / 'build.lock'
    log_file.parent.mkdir(parents=True, exist_ok=True)
    if _build_running(lock_path):
        return f'predictors are being built already (log: {log_file})'
    # The foreground build in a niced session of its own: its steps write the log
    # (run_steps); what fails before them (stderr) goes there too.
    command = [sys.executable, '-m', 'timebill_ros.cli', 'predictor', 'build', *common,
               '--prompts', str(prompts)]
    with open(log_file, 'a', encoding='utf-8') as log:
        proc = subprocess.Popen(['nice', '-n', str(nice), *command], stdout=subprocess.DEVNULL,
                                stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(os.environ))
    lock_path.write_text(str(proc.pid))
    return (f'building the {" and the ".join(missing)} in the background (pid {proc.pid}, '
            f'log: {log_file}); a server started later loads them, a running one switches '
            'to them when they are ready (predictor.reload_check_s)')


def _build_running(lock_path):
    """Return True while the process named in ``lock_path`` is alive."""
    try:
        pid = int(lock_path.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True
