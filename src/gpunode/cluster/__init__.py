"""The cluster layer: node labels by GPU model and the device-plugin manifests."""
