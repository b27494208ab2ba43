#!/bin/sh
# Stand-in for lsmod in a simulated node: the kernel's own modules (the host kernel may have none: no
# /proc/modules), then the simulated NVIDIA (or nouveau) modules of the node's driver state, read as the
# modprobe stand-in reads it. Shell, not Python: the deploy's driver check runs it on every node.
state=${GPUNODE_SIM_GPU_STATE:-/etc/gpunode-sim/gpu.json}
echo "Module                  Size  Used by"
if [ -r /proc/modules ]; then
  awk '{users = $4; gsub(/^[,-]+|[,-]+$/, "", users); sub(/ +$/, "", users)
        line = sprintf("%-19s %8s  %s %s", $1, $2, $3, users); sub(/ +$/, "", line); print line}' /proc/modules
fi
if grep -q '"loaded": true' "$state"; then
  users="2 nvidia_uvm,nvidia_modeset"
  if grep -q '"uvm": false' "$state"; then  # the uvm-missing fault: nvidia_uvm not loaded
    users="1 nvidia_modeset"
  else
    echo "nvidia_uvm           1347584  0"
  fi
  echo "nvidia_drm             73728  0"
  echo "nvidia_modeset       1294336  1 nvidia_drm"
  echo "nvidia              56713216  $users"
fi
if grep -q '"nouveau": true' "$state"; then
  echo "nouveau              2269184  0"
fi
