"""What a fleet is made of: node profiles and the GPU models they name."""
