"""Test doubles of hvdazure's own pieces (never of Horovod): see fake_backend.py."""
