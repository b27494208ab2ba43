"""Container images gpunode ships: the device plugin's, pushed to a registry of yours."""
