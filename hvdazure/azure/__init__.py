"""hvdazure.azure: Azure ML. Submitting jobs (azure-ai-ml, azureml-core) and what runs inside them.

Keep this file free of imports: the trainer imports hvdazure.azure.scheduled_events (stdlib only) inside
every Azure ML job, and that import runs this file first. Modules that need the Azure SDKs import them
themselves.
"""
