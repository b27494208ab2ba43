"""Images and layers: node root filesystems, OCI archives, the device plugin's and the workload's images, the tools
layer."""
