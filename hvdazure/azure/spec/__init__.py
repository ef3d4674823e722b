"""What `hvdazure submit` is asked for, checked offline before anything is uploaded: the job (job.py), a
sweep (sweep.py), the job's own settings and identity, its inputs and outputs, the credential rule applied to
every field, and the wiring of `--resume-from`. No Azure SDK here; nothing here imports the SDKs' modules
(v1/, v2/), the submission or `hvdazure jobs` (jobs/).
"""
