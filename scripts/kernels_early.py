"""Build the GGUF kernels while pip is still filling the venv (scripts/setup_venv.sh).

The kernels need torch, ninja and a C++ compiler only, but ``import timebill_ros.engine``
runs the engine package, which imports transformers: pip installs that after torch. So this
registers the engine package empty and runs ``python -m timebill_ros.engine.kernels`` from the
source tree: the ~60 s compile (2 cores, first build) overlaps pip's ~100 s of installing the
rest, instead of running beside colcon. The library goes to the same cache entry, so
scripts/build.sh's own call then finds it built.
"""

import pathlib
import runpy
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
engine = types.ModuleType('timebill_ros.engine')
engine.__path__ = [str(ROOT / 'timebill_ros' / 'engine')]
sys.modules['timebill_ros.engine'] = engine
runpy.run_module('timebill_ros.engine.kernels', run_name='__main__', alter_sys=True)
