"""hvdazure.azure.v2: the AzureSdk (sdk.py) on Azure ML's SDK v2 (azure-ai-ml), the default: submitting
(submit.py; a sweep job, sweep.py) and a workspace's jobs (jobs.py). azure-ai-ml is imported by its modules
themselves, when used.
"""
