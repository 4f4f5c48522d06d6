# Source from bash, from any directory:  source scripts/env.sh
# Activates .venv and, with the pip ROS 2 wheels, exports what cmake/colcon/rclpy need
# (PLATFORM.md); with a sourced ROS 2 install (ROS_DISTRO set) it only activates the venv.
# Then sources install/local_setup.bash when the package has been built.
# No `set -e` here: this file runs inside the caller's shell. It is safe under `set -eu`.

_tb_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ ! -f "$_tb_root/.venv/bin/activate" ]]; then
  echo "env.sh: no $_tb_root/.venv; run 'make venv' first" >&2
  unset _tb_root
  return 1
fi

# venv activate and colcon's scripts read unset variables: lift `set -u` meanwhile.
case $- in *u*) _tb_nounset=1 ;; *) _tb_nounset=0 ;; esac
set +u

# shellcheck disable=SC1091
source "$_tb_root/.venv/bin/activate"

_tb_prepend() {  # _tb_prepend VAR DIR: put DIR first in VAR unless already there
  local cur="${!1:-}"
  case ":$cur:" in
    *":$2:"*) ;;
    *) export "$1=$2${cur:+:$cur}" ;;
  esac
}

if [[ -z "${ROS_DISTRO:-}" ]]; then
  # ROS 2 from pip wheels: the venv prefix is the ROS prefix.
  _tb_prepend AMENT_PREFIX_PATH "$VIRTUAL_ENV"
  _tb_prepend CMAKE_PREFIX_PATH "$VIRTUAL_ENV"
  # The wheels' shared-library dirs (get_ros_paths() returns a ':'-joined str that already
  # includes the current LD_LIBRARY_PATH; a list is joined too, to be safe).
  _tb_ld="$(python -c 'import os, ros_wheels_bootstrapper as b
p = b.get_ros_paths()
print(p if isinstance(p, str) else os.pathsep.join(p))')" || _tb_ld=""
  if [[ -n "$_tb_ld" ]]; then
    export LD_LIBRARY_PATH="$_tb_ld"
    # Tells the bootstrapper's .pth hook not to re-exec every python with the same path.
    export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1
  else
    echo "env.sh: ros_wheels_bootstrapper failed; ROS libraries may not load" >&2
  fi
  export RMW_IMPLEMENTATION="${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}"
fi

# The built package (local_setup, not setup.bash: the venv prefix has no local_setup.*).
if [[ -f "$_tb_root/install/local_setup.bash" ]]; then
  # shellcheck disable=SC1091
  source "$_tb_root/install/local_setup.bash"
fi

# Running from the repo root imports the source timebill_ros first; its __init__ extends the
# package path to the installed copy, where the generated msg/action modules are.

if [[ "$_tb_nounset" == 1 ]]; then set -u; fi
unset _tb_root _tb_ld _tb_nounset
unset -f _tb_prepend
return 0
