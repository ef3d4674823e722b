"""Test doubles of hvdazure's own pieces (never of Horovod): see thread_binding.py."""
