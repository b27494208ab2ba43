"""The keys of NVIDIA's device-plugin config file (version v1) that this plugin knows, section by section.

The one table of that format: the plugin checks a config file against it, and gpunode checks ``plugin_config``
against it before it renders the ConfigMap. gpunode carries this file verbatim as
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
