"""Label each GPU node by its GPUs in Kubernetes (server-side apply, field manager gpunode).

    pyinfra inventories/prod.py deploys/labels.py
"""

from gpunode.steps.driver import driver_check
from gpunode.steps.labels import node_labels

driver_check()
node_labels()
