"""Configure NVIDIA's Container Toolkit apt repository (after the driver check).

    pyinfra inventories/prod.py deploys/toolkit_repo.py
"""

from gpunode.steps.driver import driver_check
from gpunode.steps.toolkit_repo import toolkit_repository

driver_check()
toolkit_repository()
