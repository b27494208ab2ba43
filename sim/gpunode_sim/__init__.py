"""The simulated GPU fleet: real Debian nodes with a stand-in NVIDIA driver layer.

Each node is a Debian 12 userspace (debootstrap, shared read-only through
overlayfs) running in its own UTS/IPC/mount/PID namespaces and its own network
namespace, with a real sshd, real apt and real containerd/docker. Only the
driver layer (``nvidia-smi``, ``/dev/nvidia*``, ``/proc/driver/nvidia``) and the
NVIDIA apt repository are stand-ins. The product never imports this package; it is
a distribution of its own (gpunode-sim) whose ``sim`` command group plugs into
``gpunode`` through the ``gpunode.commands`` entry points.

Rooms by concern: ``host`` (the machine), ``access`` (SSH, bastion), ``spec``
(profiles, GPU models), ``build`` (Go builds), ``repos`` (NVIDIA's repositories),
``images`` (layers and images), ``cluster`` (control plane), ``node`` (what the
host does to a node), ``guest`` (what runs inside one), ``standins`` (scripts).
"""
