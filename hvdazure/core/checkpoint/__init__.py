"""Checkpoints: storage and integrity (framework-free), a running trainer's checkpoints, and weights read back
for inference and export."""
