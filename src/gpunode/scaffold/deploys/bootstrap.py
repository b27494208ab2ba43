"""Take GPU nodes whose driver is installed to "the container runtime hands GPUs to containers".

    pyinfra inventories/prod.py deploys/bootstrap.py
"""

from gpunode.steps.bootstrap import bootstrap

bootstrap()
