#!/bin/sh
# Stand-in for modprobe in a simulated node: nvidia modules follow the simulated driver state,
# everything else goes to the real modprobe: kmod, called by that name through the simulator's link to it (this
# stand-in is /usr/sbin/modprobe itself, where Debian links kmod).
state=/etc/gpunode-sim/gpu.json
for arg in "$@"; do
  case "$arg" in
    nvidia|nvidia_uvm|nvidia-uvm|nvidia_modeset|nvidia-modeset|nvidia_drm|nvidia-drm)
      if grep -q '"loaded": true' "$state" 2>/dev/null; then exit 0; fi
      if grep -q '"installed": false' "$state" 2>/dev/null; then
        echo "modprobe: FATAL: Module $arg not found in directory /lib/modules/$(uname -r)" >&2
        exit 1
      fi
      echo "modprobe: ERROR: could not insert '$arg': No such device" >&2
      exit 1;;
  esac
done
exec /usr/lib/gpunode-sim/kmod/modprobe "$@"
