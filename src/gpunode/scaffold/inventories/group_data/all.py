"""Data for every host of the example inventories: each key gpunode reads, at its default.

Change a value here for the whole fleet, in group_data/<group>.py for a group, or
per host in the inventory. ``gpunode deploy`` and ``gpunode verify`` read the same data.
"""

# Driver check
driver_min_version = "535"          # oldest driver accepted (the GPU generation's own minimum applies too)
gpu_required = False                # True: a host without a working GPU driver fails instead of being skipped

# NVIDIA Container Toolkit repository (point these at your mirror when air-gapped)
toolkit_repository_url = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"       # apt hosts
toolkit_rpm_repository_url = "https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch"  # dnf hosts
toolkit_key_url = "https://nvidia.github.io/libnvidia-container/gpgkey"
toolkit_key_fingerprint = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"  # checked before the key is trusted

# NVIDIA Container Toolkit packages (all four at this version)
toolkit_version = "1.17.8-1"         # Debian's version; rpm's version-release on dnf hosts (the same string)
toolkit_hold = True                 # apt-mark hold / dnf versionlock, so unattended upgrades do not move them

# Container runtime
container_runtime = "auto"          # auto (docker if dockerd is installed, else containerd), containerd, docker
nvidia_runtime_default = False      # False: pods use runtimeClassName: nvidia; True: nvidia is the default runtime
cdi_enabled = False                 # enable CDI in the runtime (enable_cdi / features.cdi)
containerd_systemd_cgroup = True    # SystemdCgroup for runc when gpunode writes containerd's base config
runtime_restart_timeout = 60        # seconds to wait for the runtime to answer after a restart

# Cluster objects (gpunode render)
plugin_image = "gpunode-device-plugin:0.1.0"   # push it to your registry (gpunode image push), pin the digest
plugin_registry_username = ""                  # the nodes pull plugin_image as this user (Secret gpunode-registry)
plugin_registry_password = ""                  # from your secret store (--data), never a committed file
plugin_pull_secret = ""                        # or: a pull Secret of your own in plugin_namespace
plugin_registry_cert_dir = ""                  # here: the registry's CA (ca.crt) to pin plugin_image's tag
plugin_namespace = "gpunode-system"
plugin_mig_strategy = "none"                   # none, single, mixed
plugin_device_list_strategy = "envvar"         # envvar, volume-mounts, cdi-annotations, cdi-cri
gpu_allocation = "device-plugin"               # per node: device-plugin or dra (gpunode's DRA driver)
checker_image = ""                             # the node checker (gpunode image build --node-checker): conditions
checker_interval = 60                          # on every GPU node's Node, read by verify/doctor --in-cluster
checker_heartbeat = 300                        # its write when nothing changed (as node-problem-detector)
checker_api_server = ""                        # HOST:PORT where pods cannot use the kubernetes Service (checker, DRA)
label_model_key = "accelerator"                # the short model label: accelerator=nvidia-a100
label_model_prefix = "nvidia-"
# plugin_config = {                            # the plugin's own config file (NVIDIA's v1 format), carried by
#     "version": "v1",                         # every deploy in a ConfigMap; e.g. time-slicing, 4 pods per GPU:
#     "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
# }                                            # verify and doctor then expect 4 x GPUs nvidia.com/gpu per node
# templates_dir = "templates"                  # a folder with your own device-plugin.yaml.j2 (copy gpunode's from
                                               # gpunode/templates in the installed package); yours wins

# Kubernetes cluster (labels and device-plugin steps of bootstrap)
cluster_steps = True                # False: provision the nodes only, never talk to Kubernetes
kubeconfig = ""                     # "" means $KUBECONFIG, else ~/.kube/config (as kubectl finds it)
kube_context = ""                   # "" means the kubeconfig's current-context; gpunode needs no cluster-admin:
                                    # 'gpunode render inventories/prod.py --rbac --subject User:NAME' prints the
                                    # rules it needs, for an admin to apply once; point this at that identity
# k8s_node_name = "gpu-17"          # per host: the Node's name when it is not the host's hostname
kube_timeout = 10                   # seconds per API request
rollout_timeout = 300               # seconds to wait for the device-plugin DaemonSet rollout
allocatable_timeout = 150           # seconds to wait for a node's allocatable nvidia.com/gpu to match its GPUs

# Driver upgrades
reboot_on_mismatch = False          # True: a node whose driver was upgraded without reboot is cordoned, drained
                                    # of GPU pods (Eviction API, PodDisruptionBudgets respected), rebooted,
                                    # re-checked and uncordoned; False: it fails with "reboot required"
reboot_timeout = 300                # seconds for the drain and for the node to come back
max_unavailable = 0                 # gpunode deploy only: hosts in batches of this size, stopping at the first
                                    # batch with a failure (0: all hosts at once)
