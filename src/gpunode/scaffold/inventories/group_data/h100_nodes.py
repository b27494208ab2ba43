"""HGX H100 nodes: a newer driver floor (Hopper needs >= 520.61.05; we standardise on 550)."""

driver_min_version = "550"
