"""Install the NVIDIA Container Toolkit at the pinned version (after the driver check).

    pyinfra inventories/prod.py deploys/toolkit.py
"""

from gpunode.steps.driver import driver_check
from gpunode.steps.toolkit import toolkit_install

driver_check()
toolkit_install()
