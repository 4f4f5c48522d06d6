"""Another revision's GGUF kernels beside this checkout's, for A/B timings in one run."""

import hashlib
import pathlib
import subprocess
import tempfile


def baseline_kernels(rev: str):
    """Return the kernels of git revision ``rev`` built into a folder of their own.

    Built with this checkout's flags (``kernels.compile_flags``) from ``git show REV:...`` of
    the binding and its core. Their ``pack`` layout must be this checkout's: the callers
    compare the two builds' answers, which shows when it is not.
    """
    from torch.utils import cpp_extension

    from timebill_ros.engine import kernels
    folder = pathlib.Path(tempfile.gettempdir()) / f'timebill_kernels_{rev}'
    folder.mkdir(exist_ok=True)
    digest = hashlib.sha256()
    for original in (kernels.CORE, kernels.SOURCE):
        path = f'timebill_ros/engine/kernels/{original.name}'
        data = subprocess.run(['git', 'show', f'{rev}:{path}'], check=True,
                              capture_output=True).stdout
        (folder / original.name).write_bytes(data)
        digest.update(data)
    return cpp_extension.load(
        name=f'timebill_kernels_baseline_{digest.hexdigest()[:12]}',
        sources=[str(folder / kernels.SOURCE.name)], extra_cflags=kernels.compile_flags(),
        extra_ldflags=['-pthread'], build_directory=str(folder))


def use_kernels(root, module) -> int:
    """Point every engine object under ``root`` that holds kernels at ``module``.

    Walks the attributes, lists, tuples and dicts of ``root`` (an engine's forward) and sets
    ``kernels`` wherever an object of ``timebill_ros.engine`` has a loaded one. Returns how
    many objects were switched.
    """
    seen, stack, switched = set(), [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif type(obj).__module__.startswith('timebill_ros.engine') and hasattr(obj, '__dict__'):
            if getattr(obj, 'kernels', None) is not None:
                obj.kernels = module
                switched += 1
            stack.extend(vars(obj).values())
    return switched
