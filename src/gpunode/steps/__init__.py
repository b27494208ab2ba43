"""The provisioning steps as pyinfra ``@deploy`` functions, in the order a node needs them.

``driver_check`` → ``toolkit_repo`` → ``toolkit`` → ``runtime`` (configure, then
restart only if that changed something) → ``labels`` (the Kubernetes node's GPU
labels) → ``device_plugin`` (apply and roll out the DaemonSet, check allocatable
GPUs). The GPU steps run only where the driver check found a working driver;
``bootstrap`` chains them all.
"""

from gpunode import op_order

op_order.install()  # pyinfra's CLI ordering without inspect.stack(): see gpunode.op_order
