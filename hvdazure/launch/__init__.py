"""Starting multi-process Horovod jobs: command building (command.py), the per-rank wrapper
(rank_wrapper.py) and job supervision (supervisor.py, with tracebacks.py for the ranks' tracebacks).

Kept import-free: every rank runs `python -m hvdazure.launch.rank_wrapper`, which must start fast.
"""
