"""hvdazure.azure.v1: the AzureSdk (sdk.py) on Azure ML's legacy SDK v1 (azureml-core), past Microsoft's end
of support: submitting (submit.py; a ScriptRunConfig run, run_config.py; a HyperDrive sweep, sweep.py) and a
workspace's runs (jobs.py). Only `--sdk v1` imports this package; azureml-core is imported by its modules
themselves, when used.
"""
