"""The fleet's private image registry."""
