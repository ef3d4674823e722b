"""A submitted job as both SDKs report it, in values of hvdazure's own: its record in Run History (job.py),
where it keeps its checkpoints and which is its last (checkpoints.py), and its files downloaded into place
(download.py). No Azure SDK here: v1/ and v2/ fill these in, and `hvdazure jobs` (jobs/), `--resume-from`
(spec/resume_from.py) and the seam (sdk.py) read them; nothing here imports any of those.
"""
