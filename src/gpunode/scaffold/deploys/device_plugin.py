"""Roll out the device-plugin DaemonSet and check each GPU node's allocatable nvidia.com/gpu.

    pyinfra inventories/prod.py deploys/device_plugin.py
"""

from gpunode.steps.device_plugin import device_plugin_rollout
from gpunode.steps.driver import driver_check

driver_check()
device_plugin_rollout()
