"""Configure containerd or docker for the nvidia runtime and restart it if needed (after the driver check).

    pyinfra inventories/prod.py deploys/runtime.py
"""

from gpunode.steps.driver import driver_check
from gpunode.steps.runtime import runtime_configuration

driver_check()
runtime_configuration()
