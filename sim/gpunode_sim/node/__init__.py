"""What the host does to one node: its files, boot plan and processes."""
