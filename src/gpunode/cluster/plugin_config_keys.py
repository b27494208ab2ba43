"""The keys of NVIDIA's device-plugin config file (version v1) that this plugin knows, section by section.

The one table of that format: the plugin checks a config file against it, and gpunode checks ``plugin_config``
against it before it renders the ConfigMap. Every key NVIDIA's format defines is here, and each either works
as in NVIDIA's plugin or is refused at the values where it would not (``NOT_ACTED_ON``): none is accepted and
dropped. gpunode carries this file verbatim as
``gpunode/cluster/plugin_config_keys.py`` (the plugin imports nothing from gpunode, and gpunode runs without
the plugin installed); a test keeps the two byte-identical. Pure data: no imports.
"""

FILE_KEYS = {
    "": {"version", "flags", "sharing", "resources", "imex"},
    "flags": {"migStrategy", "failOnInitError", "nvidiaDriverRoot", "nvidiaDevRoot", "plugin", "gfd",
              "mpsRoot", "deviceDiscoveryStrategy", "gdrcopyEnabled", "gdsEnabled", "mofedEnabled"},
    "flags.plugin": {"passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy", "cdiAnnotationPrefix",
                     "nvidiaCTKPath", "containerDriverRoot", "sharedDevicesAllocationPolicy",
                     "gpunodeBackend", "gpunodeHttpAddress", "gpunodeHealthRecoverySeconds"},
    "sharing": {"timeSlicing", "mps"},
    "sharing.timeSlicing": {"renameByDefault", "failRequestsGreaterThanOne", "resources"},
    "sharing.timeSlicing.resources[]": {"name", "replicas", "rename", "devices"},
}

# NVIDIA's keys whose effect this plugin does not have: the values at which it behaves as NVIDIA's plugin does
# (absent, or these), the environment variables NVIDIA's plugin reads for them, and why other values are refused.
NOT_ACTED_ON = {
    "sharing.mps": ((), (),
                    "MPS sharing needs NVIDIA's MPS control daemon on every GPU node (its own DaemonSet) and the "
                    "plugin mounting the daemon's pipe and log folders into each container; gpunode's plugin does "
                    "not run it: use sharing.timeSlicing, or NVIDIA's plugin on the nodes that need MPS"),
    "resources": (({},), (),
                  "resources.gpus / resources.mig renames by device-name pattern are not implemented: gpunode's "
                  "plugin offers nvidia.com/gpu and nvidia.com/mig-<profile>; rename with "
                  "sharing.timeSlicing.resources[].rename, or keep NVIDIA's plugin for pattern renames"),
    "imex": (({},), ("IMEX_CHANNEL_IDS", "IMEX_REQUIRED"),
             "IMEX channels (imex.channelIDs, imex.required) are GB200 NVL multi-node NVLink devices "
             "(/dev/nvidia-caps-imex-channels) that gpunode's plugin does not inject"),
    "flags.gdsEnabled": ((False,), ("GDS_ENABLED",),
                         "GPUDirect Storage devices (/dev/nvidia-fs*) are not injected by gpunode's plugin"),
    "flags.mofedEnabled": ((False,), ("MOFED_ENABLED",),
                           "MOFED devices (/dev/infiniband) are not injected by gpunode's plugin"),
    "flags.gdrcopyEnabled": ((False,), ("GDRCOPY_ENABLED",),
                             "gdrcopy (/dev/gdrdrv) is not injected by gpunode's plugin"),
    "flags.deviceDiscoveryStrategy": (("auto", "nvml"), ("DEVICE_DISCOVERY_STRATEGY",),
                                      "gpunode's plugin discovers devices through NVML only (no Tegra)"),
    "flags.plugin.nvidiaCTKPath": (("/usr/bin/nvidia-ctk",), ("NVIDIA_CDI_HOOK_PATH", "NVIDIA_CTK_PATH"),
                                   "gpunode's plugin writes no CDI spec of its own (the node's 'nvidia-ctk cdi "
                                   "generate' does), so it runs no nvidia-ctk: only the default path is accepted"),
    "flags.plugin.containerDriverRoot": (("/driver-root",), ("DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"),
                                         "gpunode's plugin writes no CDI spec of its own, so the driver root "
                                         "inside its container is not used: only the default is accepted"),
}
# NVIDIA's keys that a device plugin does not read in NVIDIA's own plugin either, and why (accepted, as there)
NOT_THE_PLUGINS = {
    "flags.gfd": "GPU Feature Discovery's settings (the file is shared with GFD; NVIDIA's plugin ignores them too)",
    "flags.mpsRoot": "where the MPS daemon keeps its pipes: read only with sharing.mps, which is refused",
}
