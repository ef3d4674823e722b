"""tests/distributed/workers/torch_job.py on abfs:// with the retry waits shortened, as the ranks of the
storage tests run it: the Azure SDK's backoff (15 s and more before retrying a 5xx or a reset connection)
becomes about 15 ms and hvdazure's own RETRY_DELAYS hundredths of a second, so that a fault the proxy
injects is retried within the test's time; which requests are retried, and how often, stays the same.
"""

import runpy
import sys
from pathlib import Path

WORKERS = Path(__file__).resolve().parents[2] / "distributed" / "workers"
sys.path.insert(0, str(WORKERS))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from azure.storage.blob._shared import policies_async  # noqa: E402

from hvdazure.core import object_store  # noqa: E402

_sdk_backoff = policies_async.ExponentialRetry.get_backoff_time
# the factor of storage/azurite.py's SDK_BACKOFF_FACTOR (not imported: that module imports pytest)
policies_async.ExponentialRetry.get_backoff_time = lambda self, settings: _sdk_backoff(self, settings) * 0.001
object_store.RETRY_DELAYS = (0.02, 0.05, 0.1)

runpy.run_path(str(WORKERS / "torch_job.py"), run_name="__main__")
