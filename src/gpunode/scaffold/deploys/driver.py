"""Check the NVIDIA driver on every host (changes nothing).

    pyinfra inventories/prod.py deploys/driver.py
"""

from gpunode.steps.driver import driver_check

driver_check()
